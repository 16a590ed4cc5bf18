"""cptsim inside other training frameworks: ``cptsim.run.integrations.lightning.CPTCallback`` (PyTorch Lightning,
``pip install 'cptsim[lightning]'``). Each integration drives ``cptsim.run.api``'s scheduler and recorder, so its runs
are ordinary run directories for ``cptsim report``."""
