"""The verifier: does a candidate config compute the same model as the reference path?

validate (teacher-forced logits, the candidate's entry point), op_replay (every hooked op judged on
the reference's own inputs), blame (the first op that differs), cross_check (the reference path
against NumPy), sentinel (that check cached per device, driver and engine build) and budgets (what
each numeric class admits, data written by `python -m tests.calibrate`). Import the modules
themselves: this package imports nothing, so the registry can read the budgets without pulling in
the model.
"""
