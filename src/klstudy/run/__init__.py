"""Running the pipeline, on a laptop or a cluster: the `klstudy` command and what keeps a study going. The jobs
themselves are Snakemake's (workflow/rules/, and slurm/profile.yaml on a cluster); each calls a subcommand of stages.py.

    cli                the `klstudy` command line (`python -m klstudy`)
    stages             one subcommand per stage, each called by one Snakemake rule
    toy_stages         the §3 analysis's subcommands: the toy model, its fixed points, Figure 1, the atlas
    subcommands        how a subcommand is declared (its options as the decorator's keywords), parsed and run
    drive              `klstudy drive`: Snakemake run so that an interrupted `make study` resumes
    warm               warm workers: jobs forked from a server that imported torch, TRL and lm-eval once
    devices            a job's GPUs and CPU threads (a GPU job that sees none fails); under `drive --gpus`, one
                       machine's GPUs shared by a study's jobs, each on its own
    adopt              the training jobs an earlier Snakemake of this directory left in the queue, for this one to adopt
    failures           what ended a training job's attempt, and so what its retry does
    ownership          which configs' run a directory holds: an overlay cannot retrain another run's cells there
    status             `klstudy status`: where the grid stands, from its files alone
    preflight          `klstudy preflight`: the Hub, data, SLURM account, partitions, limits, GPUs and disk, checked
    check              a row of the preflight's table and its statuses
    cuda               the preflight's CUDA rows: the node driver's CUDA against torch's in each GPU job's environment
    memory_plans       the preflight's GPU memory rows: each study's vLLM engine beside training, on the cluster's GPU
    estimate           a run's peak disk and GPU-hours, from its config
    pilot              config/pilot-7b.yaml from the paper's, and `klstudy calibrate`: the grid priced at measured steps
    config_reference   config/README.md, written from the schema
    references         the references written from the code: subcommands, KLTrainerConfig, make, environment
    paper_settings     the paper's settings against config/paper.yaml (docs/paper-settings.md)

May import: core, analysis, data, train, evaluate, report.
"""
