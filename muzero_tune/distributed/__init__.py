"""The async pipeline's Ray side: the driver that alone owns the learner and the replay buffer, and the
actors that collect and evaluate beside it.

    async_driver.py  AsyncDriver (launches, weight snapshots, result handling, restarts) and
                     train_muzero_segment_async
    actors.py        CollectorWorker / EvaluatorWorker Ray actors
    placement.py     placement groups: the trial's under Tune, the run's own standalone
    cluster.py       starting or joining a Ray cluster

Training semantics are :class:`muzero_tune.pipeline.core.DriverCore`'s, shared with the sync driver.
"""
