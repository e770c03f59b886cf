"""Run outputs: what a run leaves behind and how it is read back.

    reporter.py     the drivers' reporter seam: standalone (run folder, progress lines, MLflow) or in memory
    checkpoint.py   atomic checkpoints (the evaluated snapshot and the resume state), load_policy
    run_folder.py   one run per folder: claim, continue, refuse
    resume.py       which settings may change when a run is continued
    mlflow_log.py   MLflow runs of standalone runs and Tune trials, tags, the local sqlite store

The training loop (:mod:`muzero_tune.pipeline`) writes through these; nothing here imports the loop.
"""
