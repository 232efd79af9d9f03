# The pipeline's inputs, staged once so that training and evaluation jobs never touch the network:
# every dataset as results/data/{dataset}.jsonl (its gold self-check beside it),
# every base model as results/models/{model}/


rule prepare_data:
    """One dataset in the common schema: from the hub (paper scale) or generated from a seed (embedded). Every
    gold answer is scored by its own reward first (src/klstudy/data/gold.py); the counts go beside it, and in the log."""
    output:
        data="results/data/{dataset}.jsonl",
        check="results/data/{dataset}.check.json",
    params:
        settings=lambda wildcards: Unrecorded(json.dumps(config["data"][wildcards.dataset])),
        recorded=lambda wildcards: recorded_settings(config["data"][wildcards.dataset]),
    log:
        "logs/data/{dataset}.log",
    # Data and base models first: every training cell waits for them, the toy analysis waits for nothing.
    priority: 10
    conda:
        "../../envs/klstudy.yaml"
    shell:
        "python -m klstudy prepare-data --name {wildcards.dataset} --settings {params.settings:q} --out {output.data} > {log} 2>&1"


rule base_model:
    """The base model in Hugging Face format: the tiny model built and warm-started here (or its pinned copy staged,
    checked against its spec, warm-start data and the sha256 its config names, which is what reruns it), or a hub or
    GGUF model staged."""
    input:
        warm_start=lambda wildcards: expand(
            "results/data/{dataset}.jsonl", dataset=config["models"][wildcards.model].get("warm_start_data", {})
        ),
    output:
        directory("results/models/{model}"),
    params:
        settings=lambda wildcards: Unrecorded(json.dumps(config["models"][wildcards.model])),
        recorded=lambda wildcards: recorded_settings(config["models"][wildcards.model]),
    log:
        "logs/models/{model}.log",
    benchmark:
        "results/benchmarks/models/{model}.tsv"
    threads: 2
    priority: 10
    conda:
        "../../envs/klstudy.yaml"
    shell:
        "python -m klstudy base-model --name {wildcards.model} --settings {params.settings:q}"
        " --warm-start-data {input.warm_start} --threads {threads} --out {output} > {log} 2>&1"
