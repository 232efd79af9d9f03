"""lm-eval's task files for klstudy's tasks, and the functions they call.

    utils   load a staged dataset, render each prompt, score k completions with the training reward

Each klstudy_*.yaml includes _template_yaml; harness.py hands this folder to lm-eval as its include_path.
"""
