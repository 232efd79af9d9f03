# §4.1: every trained cell and every base model on every evaluation task, with lm-eval-harness (mean@k): one job
# per (model, task), or per model for all its tasks (config evaluation.jobs; helpers in common.smk).

EVAL = config["evaluation"]


rule evaluate_cell:
    """A trained cell's final policy on one task, or on every task (evaluation.jobs); a collapsed or diverged cell is
    evaluated too, its status kept."""
    input:
        model=f"{RUN_DIR}/final",
        summary=f"{RUN_DIR}/summary.json",
        data=evaluated_data,
    output:
        json=evaluation_files(f"results/evals/{RUN_PATH}", ".json"),
        samples=evaluation_files(f"results/evals/{RUN_PATH}", ".samples.jsonl"),
    params:
        tasks=lambda wildcards: " ".join(evaluated_tasks(wildcards)),
        settings=lambda wildcards: json.dumps(evaluation_settings(config, wildcards.study)),
        data_dir="results/data",
        python=evaluate_python,
    log:
        evaluation_job(f"logs/evaluate/{RUN_PATH}") + ".log",
    benchmark:
        evaluation_job(f"results/benchmarks/evaluate/{RUN_PATH}") + ".tsv"
    threads: threads_of("evaluate")
    resources:
        **job_resources("evaluate"),
    conda:
        "../../envs/klstudy.yaml"
    shell:
        "{params.python} -m klstudy evaluate --model {input.model} --task {params.tasks} --data-dir {params.data_dir}"
        " --settings {params.settings:q} --seed {wildcards.seed} --summary {input.summary} --threads {threads}"
        " --out {output.json} --samples {output.samples} > {log} 2>&1"


rule evaluate_base:
    """A base model with its chat template (on) or without it (off: the paper's "Baseline (No-CT)"), on one task or
    on every task (evaluation.jobs)."""
    input:
        model="results/models/{model}",
        data=evaluated_data,
    output:
        json=evaluation_files("results/evals/base/{model}/template~{template}", ".json"),
        samples=evaluation_files("results/evals/base/{model}/template~{template}", ".samples.jsonl"),
    params:
        tasks=lambda wildcards: " ".join(evaluated_tasks(wildcards)),
        settings=json.dumps(EVAL),
        data_dir="results/data",
        python=evaluate_python,
    log:
        evaluation_job("logs/evaluate/base/{model}/template~{template}") + ".log",
    benchmark:
        evaluation_job("results/benchmarks/evaluate/base/{model}/template~{template}") + ".tsv"
    threads: threads_of("evaluate")
    resources:
        **job_resources("evaluate"),
    conda:
        "../../envs/klstudy.yaml"
    shell:
        "{params.python} -m klstudy evaluate --model {input.model} --task {params.tasks} --data-dir {params.data_dir}"
        " --settings {params.settings:q} --chat-template {wildcards.template} --threads {threads}"
        " --out {output.json} --samples {output.samples} > {log} 2>&1"


rule divergence:
    """Fig. 12: forward KL(π_ref‖π_θ) and π_θ's entropy at each saved snapshot of a cell, on one task's prompts."""
    input:
        snapshots=f"{RUN_DIR}/snapshots",
        summary=f"{RUN_DIR}/summary.json",
        reference="results/models/{model}",
        data=lambda wildcards: data_file(wildcards.task),
    output:
        f"results/divergence/{RUN_PATH}/{{task}}.csv",
    params:
        settings=json.dumps(config["divergence"]),
        python=job_python("divergence"),
    log:
        f"logs/divergence/{RUN_PATH}/{{task}}.log",
    benchmark:
        f"results/benchmarks/divergence/{RUN_PATH}/{{task}}.tsv"
    threads: threads_of("divergence")
    resources:
        **job_resources("divergence"),
    conda:
        "../../envs/klstudy.yaml"
    shell:
        "{params.python} -m klstudy divergence --reference {input.reference} --snapshots {input.snapshots}"
        " --data {input.data} --settings {params.settings:q} --seed {wildcards.seed}"
        " --threads {threads} --out {output} > {log} 2>&1"
