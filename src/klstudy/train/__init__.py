"""Training: the RL trainer beside its config, and one grid cell run end to end with it.

    trainer     KLTrainer (TRL's GRPOTrainer with every KL configuration of the paper) and KLTrainerConfig
    reference   the reference model, sharded like the policy and checked against it at the first step
    cell        one cell of a study grid: metrics, held-out pass@1, health rules, snapshots, resume
    slices      a cell longer than its job's time limit: stop and save before it, requeue the job, go on
    faults      fault injection for the resume tests (a process that kills or stops itself at a step)
    models      base models as local directories: built, staged from the Hub, loaded, checked
    tiny        the embedded base model: a byte-level tokenizer, a small Qwen2 and its warm start
    standins    random-weight stand-ins in the shapes of the paper's models (GPU suite, benchmarks), and shape twins
    gpu_memory  a vLLM engine's length and share of the GPU beside training, from the model's config.json
    tracking    experiment trackers of a cell (TensorBoard, Weights & Biases, trackio)
    vllm_cpu    what TRL's colocated vLLM and lm-eval's vllm backend need on a CPU

May import: core, analysis, data.
"""
