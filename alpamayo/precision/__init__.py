"""Precision recipes judged on real runs: `alpamayo precision` ranks ttnn recipes (and torch quantisation
recipes) by running the model under each on the prompt corpus and, with a drive, on its ticks. `settings` holds
what a comparison is run with, `reference` the unrounded model's figures, `drives` the recorded drive's runs and
figures, `recipes` one recipe's figures against the reference, `golden` a ttnn recipe's figures in the ttnn
golden mode, `expert` the action expert's, and `report` the report and `precision_report`, which builds it. The
recipes and plans it judges live in `alpamayo.plan`.
"""
