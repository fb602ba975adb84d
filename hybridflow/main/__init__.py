"""The front door of each process of a job: ``python -m hybridflow.main.<process>``.

One module per process the job plan (``hybridflow.job.plan``) starts: ``rollout``,
``reward``, ``learner``, ``environment`` (each a few lines over the shared ``bootstrap``:
arguments, logging, the parent watch, ``serve``) and ``coordinator`` (the
``hybridflow-coordinator`` command line: ``run`` starts the schedule, ``coordinator_run``;
the rest talk to a running one). The mains sit above every library folder: they load the job
config, call deploy's preflight and run-directory helpers and build the services, so nothing
below imports them and no import runs back up the house.
"""
