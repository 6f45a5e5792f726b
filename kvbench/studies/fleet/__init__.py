"""``kvbench fleet``: several engine instances behind a router, fed by one open-loop arrival process.

Modules: ``routing`` (routing policies behind one interface), ``core`` (the driver's view of each instance,
the router's bookkeeping, the autoscaler, the record of a run), ``sim_driver`` (simulated instances on a
virtual clock), ``actor`` and ``ray_driver`` (tensor-engine instances as Ray actors on the wall clock),
``ray_runtime`` (starting and stopping Ray), ``fleet_setup`` (settings resolved once), ``results`` (a run as a
results point and plot series) and ``study`` (every policy on the same arrivals).
"""
