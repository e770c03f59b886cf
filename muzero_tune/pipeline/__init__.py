"""The training loop and its pieces, shared by both pipelines.

    core.py         DriverCore: push, sample, train, reanalyze, evaluate bookkeeping, counters
    schedule.py     the pure decision functions (publish, evaluate, train budget, backpressure)
    learner.py      the train step (targets, loss, backward, optimizer, priority write-back)
    ssl_offload.py  the learner's helper thread for target encodings
    collector.py    segment collection with the policy's search
    evaluator.py    greedy evaluation episodes
    messages.py     the frozen dataclasses that cross process boundaries
    sync_driver.py  collect -> train -> evaluate in one process

The Ray side is :mod:`muzero_tune.distributed`, run outputs :mod:`muzero_tune.runs`.
"""
