"""Framework-free core of horovodlike: start-up, the engine binding and collectives on numpy.

The modules are layered; each imports only from the layers below it (tests/test_layering.py
checks this, function-level imports included):

    launch_contract                  the names a launcher and its ranks share
    exceptions, jobkey, compression, affinity   nothing above launch_contract
    serialization                    state trees as bytes, never pickled (no imports)
    slurm                            Slurm's host lists and a task of srun (no imports)
    mpi_init                         MPI initialised as Horovod does, when left to us
    engine, store                    the cffi engine; the launcher's rendezvous store
    launch_env, bootstrap            who am I: the launch environment, the blob exchange
    mpi_end                          under mpirun/srun, a failed job ends (MPI_Abort)
    basics                           start/stop the engine, topology queries
    process_sets                     registered sets; start() = engine + static sets
    request                          what a collective call means (names, roots, splits)
    ops                              collectives on numpy arrays, handles
    arguments                        the distributed optimizers' argument rules
    objects, dynamic_sets, elastic   object collectives, add/remove sets, elastic rounds
    autotune                         the knobs searched while the job trains
    api                              init(): elastic or plain, the public entry point
    topology                         the data × pipeline × tensor layout and its sets

A layer that needs to act when a lower one does (ops forgets its buffers on shutdown)
registers a callback there (basics._on_shutdown, basics.start's after_start) instead of
being imported by it.
"""
