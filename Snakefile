# klstudy — "A Comedy of Estimators: On KL Regularization in RL Training of LLMs", end to end.
#
#   snakemake --cores all                                    the embedded study (config.yaml), on a CPU
#   snakemake --profile slurm                                the paper's study (config/paper.yaml)
#   snakemake --cores all --configfile config/paper.yaml -n  what the paper's study would run
#
# The logic lives in the klstudy package (src/klstudy); the rules in workflow/rules only wire paths.

from pathlib import Path
import sys

sys.path.insert(0, str(Path(workflow.basedir) / "src"))
from klstudy.config import load_schema, validate_config


# config.yaml is the default, read only when no --configfile is given: Snakemake would otherwise
# merge the given file into it, and keys found only in config.yaml would leak into the paper's study.
if not workflow.config_settings.configfiles:

    configfile: "config.yaml"


# Checked before any job runs; a bad key stops here with a message that names it.
validate_config(config, load_schema(Path(workflow.basedir) / "workflow/schemas/config.schema.yaml"))


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"


# Run on the host that runs Snakemake, never submitted: staging needs the hub (often unreachable from compute
# nodes), and the others are seconds of pandas and matplotlib.
localrules:
    all,
    prepare_data,
    base_model,
    toy_unbiasedness,
    toy_fixed_points_report,
    toy_atlas_report,
    fig01,
    aggregate,
    figure,
    claims_figure,
    training_figure,
    study_tables,


include: "workflow/rules/toy.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/figures.smk"


rule all:
    input:
        toy_outputs(),
        input_outputs(),
        run_outputs(),
        evaluation_outputs(),
        divergence_outputs(),
        figure_outputs(),
    default_target: True
