"""Every figure of the study, drawn from tidy result tables (never typed-in numbers); the tables are tables.py's.
    encoding   the one style table (colour, marker, line style, hatch), the reader's names, print sizes, saving
    captions   a caption's numbers read from the drawn artists, the claims' words, the conventions page
    panels     the panel kinds of the config's ``figures`` section, each series drawn as its noise is
    paper      those figures: their panels laid out, with the claims' verdicts on them
    training   each study's training dynamics: reward, KL and gradient norm over steps
    forest     the claims forests: every claim's effect ± critical·se, coloured by its verdict
    toy        the toy model's: Figure 1, and where each configuration's training ends against the optimum
    atlas      the atlas's: how strongly each preset and configuration regularises (presets; grid), its length sweep
    redraw     every figure of a shipped folder from its tables/ (`klstudy redraw`), its README.md
"""

import matplotlib

matplotlib.use("Agg")  # every figure is written to a file: no display is needed, none is assumed
