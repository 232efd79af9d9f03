# §3.3: the parametric autoregressive model — exact gradients, Monte Carlo estimates, Figure 1, Table 1.

TOY = config["toy"]


rule toy_bias_variance:
    """Squared bias and variance of every estimator × placement, for one (a, b, a_ref, b_ref) setting."""
    output:
        "results/toy/{setting}.csv",
    params:
        settings=json.dumps(TOY),
    log:
        "logs/toy/{setting}.log",
    benchmark:
        "results/benchmarks/toy/{setting}.tsv"
    threads: threads_of("toy")
    resources:
        **job_resources("toy"),
    conda:
        "../../envs/klstudy.yaml"
    shell:
        "python -m klstudy toy --setting {wildcards.setting} --settings {params.settings:q} --threads {threads}"
        " --out {output} > {log} 2>&1"


rule toy_unbiasedness:
    """Per configuration: is the measured bias consistent with zero? (Bonferroni over settings × T × parameter)."""
    input:
        expand("results/toy/{setting}.csv", setting=TOY["settings"]),
    output:
        "results/toy/unbiasedness.csv",
    params:
        settings=json.dumps(TOY),
    log:
        "logs/toy/unbiasedness.log",
    conda:
        "../../envs/klstudy.yaml"
    shell:
        "python -m klstudy toy-tests --inputs {input} --settings {params.settings:q} --out {output} > {log} 2>&1"


rule fig01:
    input:
        results=expand("results/toy/{setting}.csv", setting=TOY["settings"]),
        tests="results/toy/unbiasedness.csv",
    output:
        png=report("figures/fig01_toy_bias_variance.png", caption="../report/fig01.rst", category="2 Analysis (§3)"),
        pdf="figures/fig01_toy_bias_variance.pdf",
        caption="figures/fig01_toy_bias_variance.md",
    params:
        settings=lambda wildcards: json.dumps(TOY["settings"]),
    log:
        "logs/figures/fig01.log",
    conda:
        "../../envs/klstudy.yaml"
    shell:
        "python -m klstudy fig01 --inputs {input.results} --tests {input.tests} --settings {params.settings:q}"
        " --out {output.png} > {log} 2>&1"



# Where each configuration's training ends: exact fixed points against the optimum of J_β, and Monte Carlo training.
FIXED_POINTS = TOY["fixed_points"]


rule toy_fixed_points:
    """Exact fixed points of every Table 1 configuration × β, and the reward–KL frontier, for one policy family."""
    output:
        points="results/toy/fixed_points/{family}.csv",
        frontier="results/toy/frontier/{family}.csv",
    params:
        settings=json.dumps(TOY),
    log:
        "logs/toy/fixed_points/{family}.log",
    benchmark:
        "results/benchmarks/toy/fixed_points/{family}.tsv"
    threads: 1
    resources:
        **job_resources("toy"),
    conda:
        "../../envs/klstudy.yaml"
    shell:
        "python -m klstudy toy-fixed-points --family {wildcards.family} --settings {params.settings:q} --threads 1"
        " --out {output.points} --frontier {output.frontier} > {log} 2>&1"


rule toy_monte_carlo:
    """Training by sampled updates through the trainer's loss: every seed and β of one family, on- or off-policy."""
    output:
        "results/toy/monte_carlo/{family}/{mode}.csv",
    params:
        settings=json.dumps(TOY),
    log:
        "logs/toy/monte_carlo/{family}/{mode}.log",
    benchmark:
        "results/benchmarks/toy/monte_carlo/{family}/{mode}.tsv"
    wildcard_constraints:
        mode="on-policy|off-policy",
    threads: 1
    resources:
        **job_resources("toy"),
    conda:
        "../../envs/klstudy.yaml"
    shell:
        "python -m klstudy toy-monte-carlo --family {wildcards.family} --mode {wildcards.mode}"
        " --settings {params.settings:q} --threads 1 --out {output} > {log} 2>&1"


rule toy_fixed_points_report:
    """The fixed-point figure, its table and the toy's claims."""
    input:
        points=expand("results/toy/fixed_points/{family}.csv", family=FIXED_POINTS["families"]),
        frontiers=expand("results/toy/frontier/{family}.csv", family=FIXED_POINTS["families"]),
        monte_carlo=expand(
            "results/toy/monte_carlo/{family}/{mode}.csv",
            family=FIXED_POINTS["monte_carlo"]["families"],
            mode=["on-policy", "off-policy"],
        ),
    output:
        png=report("figures/toy_fixed_points.png", caption="../report/toy_fixed_points.rst", category="2 Analysis (§3)"),
        pdf="figures/toy_fixed_points.pdf",
        table=report("figures/toy_fixed_points.csv", caption="../report/toy_fixed_points.rst", category="2 Analysis (§3)"),
        markdown="figures/toy_fixed_points.md",
        agreement="figures/toy_monte_carlo.csv",
        claims=report("figures/toy_claims.csv", caption="../report/toy_claims.rst", category="1 Claims"),
        claims_markdown="figures/toy_claims.md",
    params:
        settings=lambda wildcards: json.dumps({"toy": TOY, "claims_rule": config["claims_rule"]}),
    log:
        "logs/toy/fixed_points_report.log",
    conda:
        "../../envs/klstudy.yaml"
    shell:
        "python -m klstudy toy-fixed-points-report --points {input.points} --frontiers {input.frontiers}"
        " --monte-carlo {input.monte_carlo} --settings {params.settings:q} --png {output.png} > {log} 2>&1"


# The atlas: the settings practitioners run (KL configuration × advantage normalisation × G, and framework presets),
# exact per family and over the answer's length, then the Monte Carlo runs that judge its claims.
ATLAS = TOY["atlas"]


rule toy_atlas:
    """The atlas's exact end points and effective β for one family (T as toy.fixed_points), or over T ("length")."""
    output:
        "results/toy/atlas/{part}.csv",
    params:
        settings=json.dumps(TOY),
    log:
        "logs/toy/atlas/{part}.log",
    benchmark:
        "results/benchmarks/toy/atlas/{part}.tsv"
    wildcard_constraints:
        part="tabular|parametric|length",
    threads: 1
    resources:
        **job_resources("toy"),
    conda:
        "../../envs/klstudy.yaml"
    shell:
        "python -m klstudy toy-atlas --family {wildcards.part} --settings {params.settings:q} --threads 1"
        " --out {output} > {log} 2>&1"


rule toy_atlas_report:
    """The atlas's Monte Carlo runs and claims, its three figures (presets, grid, the length sweep) and tables."""
    input:
        points=expand("results/toy/atlas/{family}.csv", family=ATLAS["families"]),
        length="results/toy/atlas/length.csv",
    output:
        png=report("figures/atlas.png", caption="../report/atlas.rst", category="2 Analysis (§3)"),
        pdf="figures/atlas.pdf",
        grid_png=report("figures/atlas_grid.png", caption="../report/atlas_grid.rst", category="2 Analysis (§3)"),
        grid_pdf="figures/atlas_grid.pdf",
        grid_caption="figures/atlas_grid.md",
        length_png=report("figures/atlas_length.png", caption="../report/atlas_length.rst", category="2 Analysis (§3)"),
        length_pdf="figures/atlas_length.pdf",
        length_caption="figures/atlas_length.md",
        table=report("figures/atlas.csv", caption="../report/atlas.rst", category="2 Analysis (§3)"),
        markdown="figures/atlas.md",
        length="figures/atlas_length.csv",
        claims=report("figures/atlas_claims.csv", caption="../report/atlas_claims.rst", category="1 Claims"),
    params:
        settings=lambda wildcards: json.dumps({"toy": TOY, "claims_rule": config["claims_rule"]}),
    log:
        "logs/toy/atlas_report.log",
    benchmark:
        "results/benchmarks/toy/atlas_report.tsv"
    threads: 1
    resources:
        **job_resources("toy"),
    conda:
        "../../envs/klstudy.yaml"
    shell:
        "python -m klstudy toy-atlas-report --points {input.points} --length {input.length}"
        " --settings {params.settings:q} --threads 1 --png {output.png} > {log} 2>&1"
