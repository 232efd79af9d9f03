"""The tutorials of docs/ work as written: each test copies the repository, makes the tutorial's edits from the page's
own blocks (```diff blocks applied with `git apply`, the script saved under the name the page gives) and runs the
page's commands in the copy.

docs/tutorial-estimator.md: the new estimator reaches Table 1, the fixed points and a training cell, and the tests the
page names pass in the copy (fast, with the toy and the cell cut down; the page's own commands, at full size, are the
slow test). docs/tutorial-kltrainer.md:
the script trains two steps."""

import json
import os
import re
import shlex
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.workflow  # the end-to-end workflow tier: `make test-workflow` (docs/testing.md)

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def blocks(page: Path, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", page.read_text(), re.M | re.S)


def commands(page: Path) -> list[str]:
    return [line for block in blocks(page, "sh") for line in block.splitlines() if line.strip()]


@pytest.fixture
def copy(tmp_path):
    """The repository's tracked files in a fresh folder, with this checkout's .venv beside them."""
    if not (ROOT / ".venv" / "bin" / "python").exists():
        pytest.skip(".venv is not built (make venv builds it)")
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    repo = tmp_path / "repo"
    for name in listed.decode().split("\0"):
        if name and (ROOT / name).is_file():
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, repo / name)  # times kept: make sees the venv as current as the checkout's
    (repo / ".venv").symlink_to(ROOT / ".venv")
    return repo


def environment(repo: Path) -> dict:
    """The copy's own source first (the venv's editable install points at this checkout's)."""
    return {**os.environ, "PYTHONPATH": str(repo / "src")}


def run(command: str, repo: Path, timeout: int = 600) -> str:
    done = subprocess.run(
        shlex.split(command), cwd=repo, env=environment(repo), capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"{command}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout + done.stderr


ESTIMATOR_EDITS = ["src/klstudy/kl.py", "tests/test_kl.py", "docs/kl-names.md",
                   "src/klstudy/report/figures/encoding.py", "config.yaml"]  # fmt: skip


def make_the_estimator_edits(repo: Path) -> None:
    """The page's patches and overlay, then its commands that write files of the repository (the references)."""
    page = DOCS / "tutorial-estimator.md"
    (overlay,) = blocks(page, "yaml")
    (repo / re.search(r"save this overlay as `([\w.-]+)`", page.read_text()).group(1)).write_text(overlay)
    diffs = blocks(page, "diff")
    assert [re.search(r"^\+\+\+ b/(\S+)", d, re.M).group(1) for d in diffs] == ESTIMATOR_EDITS
    for index, diff in enumerate(diffs):
        (repo / f"edit{index}.diff").write_text(diff)
        run(f"git apply edit{index}.diff", repo)
        (repo / f"edit{index}.diff").unlink()
    for command in commands(page):
        if "config-reference" in command or "references --out-dir" in command:
            run(command, repo)


# ------------------------------------------------------------------------------------------- add an estimator

CHECK_K4 = textwrap.dedent(
    """
    import json, sys
    import torch, yaml
    from klstudy import config as configuration, kl
    from klstudy.analysis import fixed_points, toy
    from klstudy.report import tables

    from snakemake.utils import update_config

    torch.set_num_threads(1)  # the toy's tiny tensors, as the workflow's toy jobs (two threads: several times slower)
    config = configuration.validate_config(yaml.safe_load(open("config.yaml")))
    merged = yaml.safe_load(open("config.yaml"))
    update_config(merged, yaml.safe_load(open("k4.yaml")))
    assert "k4-loss" in configuration.validate_config(merged)["studies"]["onpolicy"]["kl"]
    x = torch.tensor([-0.5, 0.0, 2.0])
    assert torch.equal(kl.token_kl(x, torch.zeros(3), "k4"), x.abs())

    section = config["toy"]
    setting = toy.ToySetting("close", **section["settings"]["close"])
    results = toy.bias_variance(setting, [1, 2], section["estimators"], section["placements"], 20, 50, 0,
                                section["baseline"], section["loss_gradients"])
    table = tables.table1(toy.unbiasedness_tests(results, section["alpha"]))
    k4 = table[table.estimator == "K4"]

    points = fixed_points.fixed_point_table(
        fixed_points.family_of(section["fixed_points"], "tabular"), section["fixed_points"]["reward"],
        ["k4-reward", "k4-loss", "k4-loss-st"], [1.0], section["fixed_points"]["flow"])
    json.dump({"table1": sorted(k4.config), "expression": sorted(set(k4.expression)),
               "fixed_points": sorted(points.config), "status": sorted(set(points.status))}, sys.stdout)
    """
)


def test_the_estimator_tutorial_reaches_table1_the_fixed_points_and_a_training_cell(copy):
    make_the_estimator_edits(copy)
    found = json.loads(run(f".venv/bin/python -c {shlex.quote(CHECK_K4)}", copy).splitlines()[-1])
    assert found["table1"] == sorted(f"k4-{p}" for p in ["reward", "loss", "both", "loss-ratio", "loss-score",
                                                          "loss-st", "loss-isst"])  # fmt: skip
    assert found["expression"] == ["|log r|"]
    assert found["fixed_points"] == ["k4-loss", "k4-loss-st", "k4-reward"] and found["status"]
    # The tutorial's training cell, cut to two steps by an overlay (as config/separation.yaml is one).
    (copy / "two-steps.yaml").write_text(
        "studies:\n  onpolicy:\n    health: {collapse_window: 0}\n    final_steps: 2\n"
        "    train: {steps: 2, eval_every: 2}\ndivergence: {steps: [0, 2]}\n"
    )
    target = next(c for c in commands(DOCS / "tutorial-estimator.md") if "k4-loss" in c)
    assert target.endswith("--configfile config.yaml k4.yaml"), target
    run(f"{target} two-steps.yaml", copy)
    summary_path = next(w for w in shlex.split(target) if w.endswith("summary.json"))
    summary = json.loads((copy / summary_path).read_text())
    assert summary["status"] == "ok" and summary["steps_done"] == 2 and summary["cell"]["kl"] == "k4-loss"
    # The page's own tests of what it touched, in the copy, those that meet K4 (each test over every estimator): they
    # fail if a step the page needs were missing. The whole command (the three files, 5-10 minutes on 2 cores) runs in
    # test_the_estimator_tutorial_runs_as_written, `make test-all`.
    (tests,) = [c for c in commands(DOCS / "tutorial-estimator.md") if c.startswith(".venv/bin/pytest")]
    out = run(f"{tests} -q -p no:cacheprovider -k k4", copy, timeout=900)
    assert re.search(r"\b([2-9]|\d\d+) passed", out) and "failed" not in out, out[-2000:]


@pytest.mark.slow
def test_the_estimator_tutorial_runs_as_written(copy):
    make_the_estimator_edits(copy)
    output = "".join(run(command, copy) for command in commands(DOCS / "tutorial-estimator.md"))
    assert re.search(r"^k4-reward,k4,\|log r\|,reward", output, re.M), output[-3000:]
    points = (copy / "results" / "toy" / "fixed_points" / "tabular.csv").read_text()
    assert ",k4-loss," in points and ",k4-both," in points
    cell = copy / "results" / "runs" / "onpolicy" / "tiny" / "k4-loss" / "beta~0.1" / "seed~0"
    assert json.loads((cell / "summary.json").read_text())["status"] == "ok"


# --------------------------------------------------------------------------------- KLTrainer in your own script


def test_the_kltrainer_tutorial_script_trains_two_steps(copy):
    page = DOCS / "tutorial-kltrainer.md"
    (script,) = blocks(page, "python")
    name = re.search(r"Save this as `([\w.]+)`", page.read_text()).group(1)
    (copy / name).write_text(script)
    output = "".join(run(command, copy, timeout=300) for command in commands(page) if name in command)
    logged = [json.loads(line.replace("'", '"')) for line in re.findall(r"\{'loss'.*?\}", output)]
    assert len(logged) == 2, output[-3000:]
    assert all("kl_k1" in step and "task_reward" in step for step in logged)


# ----------------------------------------------------------------------------------------- add a model from the hub

MAKE_STANDIN = "from klstudy.train import standins; import sys; standins.build('tiny', sys.argv[1], dtype='float32')"


def test_the_hub_model_tutorial_stages_its_copy_prices_the_run_and_trains_a_cell(copy):
    """The page's overlay, with a stand-in (random weights, Qwen2's class at the tiny width) where `hf download`
    puts the model; the cost line, one cell cut to two steps, and the figures `make study` then draws."""
    page = DOCS / "tutorial-hub-model.md"
    (overlay,) = blocks(page, "yaml")
    name = re.search(r"Save this as `([\w.-]+)`", page.read_text()).group(1)
    (copy / name).write_text(overlay)
    (download,) = [shlex.split(c) for c in commands(page) if c.startswith(".venv/bin/hf download")]
    local_dir = download[download.index("--local-dir") + 1]
    run(f".venv/bin/python -c {shlex.quote(MAKE_STANDIN)} {local_dir}", copy)

    (dry,) = [c for c in commands(page) if " -n " in c]
    assert re.search(r"peak disk under results/: .*\nGPU-hours", run(dry, copy))

    (copy / "two-steps.yaml").write_text(
        "studies:\n  onpolicy_qwen:\n    health: {collapse_window: 0}\n    train: {steps: 2, eval_every: 2}\n"
    )
    (cell,) = [c for c in commands(page) if c.endswith(name) and "summary.json" in c]
    run(f"{cell} two-steps.yaml", copy, timeout=900)
    summary_path = next(w for w in shlex.split(cell) if w.endswith("summary.json"))
    summary = json.loads((copy / summary_path).read_text())
    assert summary["status"] == "ok" and summary["steps_done"] == 2
    staged = json.loads((copy / "results" / "models" / summary["cell"]["model"] / "config.json").read_text())
    assert staged["architectures"] == ["Qwen2ForCausalLM"]  # the copy in local_dir, not the embedded model

    check = (
        "import sys, yaml; from snakemake.utils import update_config; from klstudy import config as c; "
        "merged = yaml.safe_load(open('config.yaml')); update_config(merged, yaml.safe_load(open(sys.argv[1]))); "
        "print(c.figure_targets(c.validate_config(merged)))"
    )
    targets = run(f".venv/bin/python -c {shlex.quote(check)} {name}", copy)
    lines = page.read_text().splitlines()
    listed = [line.strip("-` ").split(":")[0] for line in lines if line.startswith("- `figures/")]
    assert listed and all(path.removesuffix(".png") in targets for path in listed if path.endswith(".png")), listed


# ------------------------------------------------------------------------------------------------- a first run


def test_the_first_run_says_how_many_cells_a_learning_rate_edit_reruns():
    """The page's counts are those whose settings (ownership.cell_digests) an edit of the anchored learning rate
    changes, and the on-policy study's own."""
    import yaml

    from klstudy.config import validate_config
    from klstudy.run.ownership import cell_digests

    text = (ROOT / "config.yaml").read_text()
    anchor = text.index("&onpolicy_train")  # studies.onpolicy.train
    edited = text[:anchor] + re.sub(r"learning_rate: [\d.e+-]+", "learning_rate: 9.0e-9", text[anchor:], count=1)
    before = cell_digests(validate_config(yaml.safe_load(text)))
    after = cell_digests(validate_config(yaml.safe_load(edited)))
    changed = [path for path in before if before[path] != after[path]]
    page = " ".join((DOCS / "tutorial-first-run.md").read_text().split())
    said = re.search(r"changes all (\d+) cells of the default study, not only the (\d+) of `onpolicy`", page)
    assert said and int(said.group(1)) == len(changed) == len(before)
    assert int(said.group(2)) == len([path for path in before if "/onpolicy/" in path])


@pytest.mark.slow  # the whole default study: 11-25 minutes on 2 cores
def test_the_first_run_runs_as_written(copy):
    """Every command of the page but `make venv` (the copy has the venv), in order: the study, its report with the
    sections the page lists, the rerun of one cell and the dry run."""
    page = DOCS / "tutorial-first-run.md"
    for command in commands(page):
        if not command.endswith("make venv"):
            run(command, copy, timeout=3600)
    report = (copy / "report.html").read_text()
    sections = re.findall(r"\*\*\d ([A-Z][\w ()§0-9]+?)\*\*", (page).read_text())
    assert sections and all(name.split(" (")[0] in report for name in sections), sections
