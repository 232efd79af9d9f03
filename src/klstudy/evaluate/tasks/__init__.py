"""lm-eval's task files for klstudy's tasks (klstudy_*.yaml, each including _template_yaml), and what they call.

    utils   load a staged dataset, render each prompt, score k completions with the training reward
"""
