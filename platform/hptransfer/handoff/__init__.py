"""The hand-off any trainer can use: µP (or SP) folded into a plain Hugging Face model at step 0,
per-parameter optimizer groups, and conformance batches with the losses to reproduce.

`fold.py` (the derivation: forward multipliers → initial weights + LR/wd/ε multipliers), `groups.py`
(`optimizer.json`), `write.py` (`write_handoff`, the `hpt handoff` verb), `trainers.py` (the same
groups in torchtitan, Megatron-core, HF Trainer and DeepSpeed form, checked with their own code).
"""

from hptransfer.handoff.groups import OptimizerSpec, build_adamw, torch_param_groups

__all__ = ["OptimizerSpec", "build_adamw", "torch_param_groups", "write_handoff"]


def write_handoff(*args, **kwargs):
    """`hptransfer.handoff.write.write_handoff` (imported on call: it needs torch and transformers)."""
    from hptransfer.handoff.write import write_handoff as _write

    return _write(*args, **kwargs)
