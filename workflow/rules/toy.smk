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
        png=report("figures/fig01_toy_bias_variance.png", caption="../report/fig01.rst", category="§3 Analysis"),
        pdf="figures/fig01_toy_bias_variance.pdf",
    log:
        "logs/figures/fig01.log",
    conda:
        "../../envs/klstudy.yaml"
    shell:
        "python -m klstudy fig01 --inputs {input.results} --tests {input.tests} --out {output.png} > {log} 2>&1"

