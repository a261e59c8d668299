"""The memory ops: the layers whose maths is the subject of the project, apart from the platform
(model, training, runs) that hosts them. Specification: docs/fwpkm.md.

    fwpkm.py         the Fast-weight Product Key Memory layer (`FwPKM`, `FwPKMConfig`,
                     `WriteRule`, `FastWeightState`, `RankSum`): read, chunked writes, fast state
    fwpkm_naive.py   its loop-based reference, for tests only; kept beside the fast op it checks,
                     as flash-linear-attention keeps `naive.py` beside each `ops/<op>/`
    product_keys.py  the product-key lookup (IDW or dot scores) shared by FwPKM and PKM
    pkm.py           the static product-key memory (`PKM`, `PKMConfig`), in place of a block's MLP
    norm.py          RMSNorm, used by the model, PKM and FwPKM

Import the modules themselves (`from cl_platform.memory.fwpkm import FwPKM`): this file imports
nothing, so importing the package does no work.
"""
