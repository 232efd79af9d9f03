# §4.1: every trained cell and every base model on every evaluation task, with lm-eval-harness (mean@k).

EVAL = config["evaluation"]


rule evaluate_cell:
    """A trained cell's final policy on one task; a collapsed or diverged cell is evaluated too, its status kept."""
    input:
        model=f"{RUN_DIR}/final",
        summary=f"{RUN_DIR}/summary.json",
        data=lambda wildcards: data_file(wildcards.task),
    output:
        json=f"results/evals/{RUN_PATH}/{{task}}.json",
        samples=f"results/evals/{RUN_PATH}/{{task}}.samples.jsonl",
    params:
        settings=json.dumps(EVAL),
        data_dir="results/data",
    log:
        f"logs/evaluate/{RUN_PATH}/{{task}}.log",
    benchmark:
        f"results/benchmarks/evaluate/{RUN_PATH}/{{task}}.tsv"
    threads: 1
    conda:
        "../../envs/klstudy.yaml"
    shell:
        "python -m klstudy evaluate --model {input.model} --task {wildcards.task} --data-dir {params.data_dir}"
        " --settings {params.settings:q} --seed {wildcards.seed} --summary {input.summary} --threads {threads}"
        " --out {output.json} --samples {output.samples} > {log} 2>&1"


rule evaluate_base:
    """A base model on one task, with its chat template (on) or without it (off: the paper's "Baseline (No-CT)")."""
    input:
        model="results/models/{model}",
        data=lambda wildcards: data_file(wildcards.task),
    output:
        json="results/evals/base/{model}/template~{template}/{task}.json",
        samples="results/evals/base/{model}/template~{template}/{task}.samples.jsonl",
    params:
        settings=json.dumps(EVAL),
        data_dir="results/data",
    log:
        "logs/evaluate/base/{model}/template~{template}/{task}.log",
    threads: 1
    conda:
        "../../envs/klstudy.yaml"
    shell:
        "python -m klstudy evaluate --model {input.model} --task {wildcards.task} --data-dir {params.data_dir}"
        " --settings {params.settings:q} --chat-template {wildcards.template} --threads {threads}"
        " --out {output.json} --samples {output.samples} > {log} 2>&1"
