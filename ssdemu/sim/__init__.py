"""The timing model and profiles: the drive's NAND, link, controller, FTL, write cache and
TOPS budget as arithmetic on virtual time (`_model`, built from c/model without liburing),
the YAML profiles that parametrize it, and the kernels' cost formulas.  Usable without the
device: model-mode replay, `bench device` and sweeps import nothing that links liburing."""
