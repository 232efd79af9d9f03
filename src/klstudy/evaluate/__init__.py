"""Evaluation of trained policies: lm-eval-harness on klstudy's tasks, and the divergences of Fig. 12.

    harness      lm-eval-harness: mean@k on klstudy's tasks with its hf or vllm backend
    tasks/       the lm-eval task files, and the functions they call (load, render, score with data's rewards)
    divergence   forward KL(π_ref‖π_θ) and token entropy of a training snapshot (Fig. 12)

May import: core, analysis, data, train.
"""
