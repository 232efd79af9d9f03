# Helpers shared by the rules: how a stage runs, wildcard constraints, target lists.

import shlex

from snakemake.settings.types import DeploymentMethod

# Every stage is `python -m klstudy <stage>`, with the klstudy source tree importable. Without
# --software-deployment-method conda, `python` is the interpreter running Snakemake (the project's
# environment from `make venv`), whether or not it is activated; with conda, it is the rule's
# envs/klstudy.yaml environment. PYTHONPATH is set inside the command because Snakemake clears the
# inherited one for conda jobs.
_SRC = shlex.quote(str(Path(workflow.basedir) / "src"))
_PYTHON_BIN = shlex.quote(str(Path(sys.executable).parent))
_USES_CONDA = DeploymentMethod.CONDA in workflow.deployment_settings.deployment_method
shell.prefix(
    "set -euo pipefail; "
    f"export PYTHONPATH={_SRC}${{{{PYTHONPATH:+:$PYTHONPATH}}}}; "
    + ("" if _USES_CONDA else f'export PATH={_PYTHON_BIN}:"$PATH"; ')
)


wildcard_constraints:
    setting=r"[A-Za-z0-9][A-Za-z0-9._-]*",


def toy_outputs():
    """Everything the §3 analysis produces: Figure 1 and Table 1."""
    return [
        "figures/fig01_toy_bias_variance.png",
        "figures/fig01_toy_bias_variance.pdf",
        "figures/table1.md",
        "figures/table1.csv",
    ]
