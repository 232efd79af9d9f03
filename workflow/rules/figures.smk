# Aggregation into tidy tables, then every figure and table of §4 (the §3 ones are in toy.smk).


rule aggregate:
    """Tidy CSV tables of the whole grid; cells without results are rows with status "missing"."""
    input:
        run_outputs(),
        evaluation_outputs(),
        divergence_outputs(),
    output:
        expand("results/tables/{table}.csv", table=AGGREGATED_TABLES),
        config=report("results/tables/config.yaml", caption="../report/config.rst", category="6 Configuration"),
    params:
        settings=json.dumps(config),
        out_dir=lambda wildcards, output: os.path.dirname(output.config),
    log:
        "logs/aggregate.log",
    conda:
        "../../envs/klstudy.yaml"
    shell:
        "python -m klstudy aggregate --settings {params.settings:q} --results results --out-dir {params.out_dir}"
        " > {log} 2>&1"


rule figure:
    """One of the paper's figures 2-13, as the config's `figures` section arranges it; its caption (figures/<name>.md)
    says what is particular to it, its numbers read from what it draws, and the verdicts of the claims about its
    panels."""
    input:
        tables=rules.aggregate.output,
        config=rules.aggregate.output.config,
        claims="figures/claims.csv",
    output:
        png=report(
            "figures/{figure}.png",
            caption="../report/figure.rst",
            category="3 Experiments (§4)",
            labels={"figure": "{figure}"},
        ),
        pdf="figures/{figure}.pdf",
        caption="figures/{figure}.md",
    params:
        tables=lambda wildcards, input: os.path.dirname(input.config),
    wildcard_constraints:
        figure="|".join(re.escape(name) for name in config["figures"]),  # not the claims or training figures
    log:
        "logs/figures/{figure}.log",
    conda:
        "../../envs/klstudy.yaml"
    shell:
        "python -m klstudy figure --name {wildcards.figure} --config {input.config}"
        " --tables {params.tables} --claims {input.claims} --out {output.png} > {log} 2>&1"


rule claims_figure:
    """One metric's testable claims of the claims table: effect ± critical·se, coloured by verdict (the report's
    first figures; one per metric, config.claims_figures)."""
    input:
        claims="figures/claims.csv",
        config=rules.aggregate.output.config,
    output:
        png=report(
            f"figures/{CLAIMS_FIGURE}_{{metric}}.png",
            caption="../report/claims_forest.rst",
            category="1 Claims",
            subcategory="Every testable claim at a glance",
            labels={"metric": "{metric}"},
        ),
        pdf=f"figures/{CLAIMS_FIGURE}_{{metric}}.pdf",
        caption=f"figures/{CLAIMS_FIGURE}_{{metric}}.md",
    wildcard_constraints:
        metric="|".join(re.escape(Path(name).name.removeprefix(f"{CLAIMS_FIGURE}_")) for name in claims_figures(config))
        or "none",
    log:
        f"logs/figures/{CLAIMS_FIGURE}_{{metric}}.log",
    conda:
        "../../envs/klstudy.yaml"
    shell:
        "python -m klstudy claims-figure --claims {input.claims} --config {input.config} --metric {wildcards.metric}"
        " --out {output.png} > {log} 2>&1"


rule training_figure:
    """A study's training reward, KL to the reference and gradient norm over steps (config.training_figures: none for
    a study whose every batch was sampled by the initial policy)."""
    input:
        tables=rules.aggregate.output,
        config=rules.aggregate.output.config,
    output:
        png=report(
            "figures/training_{study}.png",
            caption="../report/training.rst",
            category="4 Training dynamics (§4)",
            labels={"study": "{study}"},
        ),
        pdf="figures/training_{study}.pdf",
        caption="figures/training_{study}.md",
    params:
        tables=lambda wildcards, input: os.path.dirname(input.config),
    wildcard_constraints:
        study="|".join(re.escape(Path(name).name.removeprefix("training_")) for name in training_figures(config))
        or "none",
    log:
        "logs/figures/training_{study}.log",
    conda:
        "../../envs/klstudy.yaml"
    shell:
        "python -m klstudy training-figure --study {wildcards.study} --config {input.config}"
        " --tables {params.tables} --out {output.png} > {log} 2>&1"


rule figures_readme:
    """figures/README.md: how to read every figure (the encoding, the noise drawn, verdicts), said once, and what this
    run's figures leave out; the report shows it first."""
    input:
        config=rules.aggregate.output.config,
    output:
        report("figures/README.md", caption="../report/readme.rst", category="0 How to read the figures"),
    log:
        "logs/figures/readme.log",
    conda:
        "../../envs/klstudy.yaml"
    shell:
        "python -m klstudy figures-readme --config {input.config} --out {output} > {log} 2>&1"


rule study_tables:
    """Table 1 (bias from the toy model, behaviour from the runs), Table 2, the evaluation differences and summary, the
    claims table (which of the paper's claims the run shows) and the regularisation table, whose verdicts are that
    table's."""
    input:
        tables=rules.aggregate.output,
        config=rules.aggregate.output.config,
        toy_tests="results/toy/unbiasedness.csv",
    output:
        # Each table as Markdown and as CSV; the CSV goes into the report with the caption named after it.
        **{f"{name}_md": f"figures/{name}.md" for name in STUDY_TABLES},
        **{
            name: report(
                f"figures/{name}.csv",
                caption=f"../report/{name}.rst",
                # the report's first question: what did the run show? (the menu sorts categories by name)
                category="1 Claims" if name == "claims" else "5 Tables",
                subcategory="The claims table" if name == "claims" else None,
            )
            for name in STUDY_TABLES
        },
    params:
        tables=lambda wildcards, input: os.path.dirname(input.config),
        out_dir=lambda wildcards, output: os.path.dirname(output.table1),
    log:
        "logs/figures/tables.log",
    conda:
        "../../envs/klstudy.yaml"
    shell:
        "python -m klstudy tables --config {input.config} --tables {params.tables}"
        " --toy-tests {input.toy_tests} --out-dir {params.out_dir} > {log} 2>&1"
