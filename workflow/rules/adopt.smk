# Adoption (klstudy/run/adopt.py; its helpers in common.smk): a job that an earlier Snakemake of this directory left in
# the SLURM queue, running or pending, of any cluster rule, is made here by a local rule that waits for it, never
# submitted a second time. Each cluster rule X (not local: workflow._localrules holds the Snakefile's localrules and
# every `localrule: True`) has its twin adopted_X, ordered first, built from X itself: X's input and params, so that
# what Snakemake records for the job is what it would record for X's and nothing reruns afterwards, and X's outputs
# as update(): Snakemake removes a job's existing outputs before it starts, and the adopted job may still be writing
# them. Once the job has left the queue its outputs are Snakemake's as if X had run; a job that ended without them
# fails in this run, and the next submits it again. Its log is its own (the job's would be deleted before it starts),
# it has no benchmark (it would replace the job's), and it holds the job's training or evaluation slot. (train.smk
# orders adopted_train_rl before refused_train_rl too.)

for original in [rule for rule in workflow.rules if rule.name not in workflow._localrules]:  # the cluster rules

    rule:
        name:
            f"adopted_{original.name}"
        input:
            *original.input,
            only_adopted(original.name),
        output:
            [updated(file) for file in original.output],
        params:
            *original.params,
            job=adopted_job(original.name),
        log:
            original.log[0].removesuffix(".log") + ".adopted.log",
        localrule: True
        retries: 0
        resources:
            **{slot: 1 for slot in ("training_slots", "evaluation_slots") if slot in original.resources},
        conda:
            "../../envs/klstudy.yaml"
        shell:
            ADOPTED_WAIT

    workflow.ruleorder(f"adopted_{original.name}", original.name)
