"""Precision recipes judged on real runs: `alpamayo precision` ranks ttnn recipes (and a torch quantisation
recipe) by running the model under each on the prompt corpus and, with a drive, on its ticks (`planner`), the
action expert's figures included (`expert`). The recipes and plans it judges live in `alpamayo.plan`.
"""
