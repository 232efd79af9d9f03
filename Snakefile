# klstudy — "A Comedy of Estimators: On KL Regularization in RL Training of LLMs", end to end.
#
#   snakemake --cores all                                    the embedded study (config.yaml), on a CPU
#   snakemake --profile slurm                                the paper's study (config/paper.yaml)
#   snakemake --cores all --configfile config/paper.yaml -n  what the paper's study would run
#
# The logic lives in the klstudy package (src/klstudy); the rules in workflow/rules only wire paths.

from pathlib import Path
import signal
import sys
import threading

sys.path.insert(0, str(Path(workflow.basedir) / "src"))
from klstudy.config import load_schema, validate_config


# SLURM's warning before a training job's time limit (sbatch --signal=USR1@N, klstudy/train/slices.py) reaches every
# process of the job's steps, this Snakemake's too; the trainer alone acts on it. Ignored here, it stays ignored in the
# rule's shell, tee and the launcher (children inherit an ignored signal).
if threading.current_thread() is threading.main_thread():
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)

# config.yaml is the default, read only when no --configfile is given: Snakemake would otherwise
# merge the given file into it, and keys found only in config.yaml would leak into the paper's study.
if not workflow.config_settings.configfiles:

    configfile: "config.yaml"


# Checked before any job runs; a bad key stops here with a message that names it.
validate_config(config, load_schema(Path(workflow.basedir) / "workflow/schemas/config.schema.yaml"))

# The cells training at once (each train_rl job holds one slot): bounds the checkpoints on disk. A --resources
# training_slots=N on the command line wins.
if "training_slots" not in workflow.global_resources:
    workflow.register_resource("training_slots", config["cluster"]["training_slots"])
# The evaluation and Fig. 12 jobs queued or running at once (each holds one slot), likewise.
if "evaluation_slots" not in workflow.global_resources:
    workflow.register_resource("evaluation_slots", config["cluster"]["evaluation_slots"])

# What the run costs (klstudy/run/estimate.py), on every invocation of the driver, the dry run included; not in jobs.
if workflow.is_main_process and any("parameters_b" in model for model in config["models"].values()):
    from klstudy.run.estimate import summary

    print("\n".join(summary(config)), file=sys.stderr)


# When jobs are about to run (not in a dry run): this directory's run is recorded as this config files' one, and a run
# of other configs that would overwrite its cells stops here, saying where to run it instead (klstudy/run/ownership.py).
# On a cluster, before the first job is submitted: hub access, data sources, SLURM account, partitions, time limits,
# GPUs and disk (klstudy/run/preflight.py); a failing check stops the run. `--config preflight=False` skips it.
onstart:
    from klstudy.run.ownership import claim

    claim(config, workflow.config_settings.configfiles or ["config.yaml"], Path(workflow.basedir), Path.cwd())
    if workflow.non_local_exec:
        from klstudy.run.preflight import run_before_submitting

        if SQUEUE_FAILED:  # common.smk: the jobs left in the queue are unknown, and would run a second time
            raise SystemExit(f"klstudy: {SQUEUE_FAILED}: not submitting, since a job of this directory still in the"
                             " queue would run a second time; run again once squeue answers")

        train_rl = workflow.get_rule("train_rl")
        train_rl.restart_times = max(CLUSTER_TRAIN_RETRIES, workflow.execution_settings.retries)

        run_before_submitting(config, Path.cwd(), jobs=workflow.resource_settings.nodes)


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"


# Run on the host that runs Snakemake, never submitted: staging needs the hub (often unreachable from compute
# nodes), and the others are seconds of pandas and matplotlib.
localrules:
    all,
    stage,
    prepare_data,
    base_model,
    toy_unbiasedness,
    toy_fixed_points_report,
    toy_atlas_report,
    fig01,
    aggregate,
    figure,
    claims_figure,
    figures_readme,
    training_figure,
    study_tables,


include: "workflow/rules/toy.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/figures.smk"


# `make stage`: every dataset and base model, on the login node, before a driver on a compute node without network.
rule stage:
    input:
        input_outputs(),


rule all:
    input:
        toy_outputs(),
        input_outputs(),
        run_outputs(),
        evaluation_outputs(),
        divergence_outputs(),
        figure_outputs(),
    default_target: True


# Last, once every rule is defined: each cluster rule's twin that waits for its job left in the queue.
include: "workflow/rules/adopt.smk"
