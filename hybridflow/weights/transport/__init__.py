"""The torch side of the distributed weight path: the weight-sync process group (``group``),
the executors that run a transfer plan over it (``executors``, ``replay``; ``reference`` is
the plan's plain-torch oracle), and the same-host links that copy straight into a replica's
shared memory (``shm``, ``staging``, ``same_host``). The plans themselves are
``hybridflow.resharding``'s (numpy only); ``hybridflow.weights.dist_formation``,
``dist_publisher`` and ``dist_receiver`` drive both."""
