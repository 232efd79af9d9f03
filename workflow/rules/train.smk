# §4: RL fine-tuning, one job per grid cell (study × model × KL configuration × β × seed).

TRAIN_INPUT = dict(
    model="results/models/{model}",
    train_data=lambda wildcards: data_file(config["studies"][wildcards.study]["train_data"]),
    heldout_data=lambda wildcards: data_file(config["studies"][wildcards.study]["heldout_data"]),
)
# metrics.jsonl and heldout.jsonl grow while the cell trains; final/, snapshots/ and summary.json appear at its end.
TRAIN_OUTPUT = dict(
    metrics=f"{RUN_DIR}/metrics.jsonl",
    heldout=f"{RUN_DIR}/heldout.jsonl",
    summary=f"{RUN_DIR}/summary.json",
    final=directory(f"{RUN_DIR}/final"),
    snapshots=directory(f"{RUN_DIR}/snapshots"),
)
# Snakemake records only `training` (what the cell trains: config.training_settings); the operational settings, the
# launcher line (absolute paths) and the paths are Unrecorded (common.smk), so changing them reruns no finished cell
# (docs/running.md, "What reruns a finished cell").
rule train_rl:
    """Train one cell; a diverged or collapsed run ends early with its status in summary.json, not as a failure."""
    input:
        **TRAIN_INPUT,
    output:
        **TRAIN_OUTPUT,
    params:
        training=training_param,
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


# A cell refused before its first job (common.smk's _refused: it has had cluster.max_attempts jobs, or its last attempt
# on the cluster failed deterministically): made here, on the submit host, by failing with that reason, so that no job
# is submitted. Its input, params and update() outputs are train_rl's, as an adopted job's are (adopt.smk), for the same
# reasons: a finished cell does not rerun for it, and its failure removes nothing the cell's jobs wrote.
rule refused_train_rl:
    input:
        **TRAIN_INPUT,
        refused=only_refused,
    output:
        **{name: update(path) for name, path in TRAIN_OUTPUT.items()},
    params:
        training=training_param,
        history=unrecorded_path(HISTORY),
    log:
        f"logs/train/{RUN_PATH}.refused.log",
    localrule: True
    retries: 0
    conda:
        "../../envs/klstudy.yaml"
    shell:
        LAST_FAILURE + " 2>&1 | tee {log} >&2; exit 1"


ruleorder: adopted_train_rl > refused_train_rl > train_rl
