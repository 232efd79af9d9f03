# §4: RL fine-tuning, one job per grid cell (study × model × KL configuration × β × seed).


rule train_rl:
    """Train one cell; a diverged or collapsed run ends early with its status in summary.json, not as a failure."""
    input:
        model="results/models/{model}",
        train_data=lambda wildcards: data_file(config["studies"][wildcards.study]["train_data"]),
        heldout_data=lambda wildcards: data_file(config["studies"][wildcards.study]["heldout_data"]),
    output:
        metrics=f"{RUN_DIR}/metrics.jsonl",
        heldout=f"{RUN_DIR}/heldout.jsonl",
        summary=f"{RUN_DIR}/summary.json",
        final=directory(f"{RUN_DIR}/final"),
        snapshots=directory(f"{RUN_DIR}/snapshots"),
    # Snakemake records only `training` (what the cell trains: config.training_settings); the operational settings,
    # the launcher line (absolute paths) and the paths are Unrecorded (common.smk), so changing them reruns no
    # finished cell (docs/running.md, "What reruns a finished cell").
    params:
        training=lambda wildcards: json.dumps(training_settings(cell_config(wildcards)), sort_keys=True),
        settings=lambda wildcards: Unrecorded(json.dumps(cell_config(wildcards))),
        launcher=lambda wildcards: Unrecorded(train_launcher(wildcards)),
        out=unrecorded_path(RUN_DIR),
        # Outside the declared outputs: Snakemake deletes those when a job fails, checkpoints must survive.
        checkpoints=unrecorded_path(f"results/checkpoints/{RUN_PATH}"),
        history=unrecorded_path(HISTORY),  # every attempt's output, kept across retries (common.smk)
    log:
        f"logs/train/{RUN_PATH}.log",
    benchmark:
        f"results/benchmarks/train/{RUN_PATH}.tsv"
    threads: threads_of("train")
    resources:
        **job_resources("train"),
    conda:
        "../../envs/klstudy.yaml"
    # A job that stops on SLURM's warning before its time limit (slices.py) leaves the cell unfinished: requeued.
    shell:
        TRAIN_SHELL
