"""The datasets, as one schema of staged JSONL records, and what reads the answers written to them.

    staging         build a dataset (the Hub's, or a procedural stand-in), check it and stage it as JSONL
    procedural      the embedded stand-ins for the paper's datasets: same schema, same prompt formats, same roles
    prompts         the prompt formats both scales share, and the chat prompt
    rewards         verifiable rewards (math-verify in an isolated worker, multiple choice, Countdown), never raising
    answer_text     where a completion states its answer: its bounded tail and its boxes
    choice_letter   the letter of a multiple-choice completion, one rule judged on what real models write
    gold            which box of a reference solution is its answer, and the self-check of every staged dataset

May import: core, analysis.
"""
