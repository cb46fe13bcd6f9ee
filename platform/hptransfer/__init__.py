"""hptransfer: tune small widths on Ray, transfer hyperparameters to a large target, train it."""

__version__ = "0.1.0"


def _hide_a_broken_torchvision() -> None:
    """mup declares torchvision and never imports it. Next to a torch it was not built for (a CPU or
    a user's own build; pip picks torchvision's CUDA wheel), its compiled ops do not load, and
    `import transformers`, which imports torchvision whenever it finds it, fails with `operator
    torchvision::nms does not exist`. Such a torchvision is hidden from this process (transformers
    then sees none); a working one, or none, is left alone. Costs a torchvision import only where one
    is installed."""
    import importlib.util
    import sys

    if "torchvision" in sys.modules or importlib.util.find_spec("torchvision") is None:
        return
    try:
        import torchvision  # noqa: F401
    except Exception:  # RuntimeError from its op registration, ImportError of its C extension
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
        sys.modules["torchvision"] = None  # find_spec → None, import → ImportError


_hide_a_broken_torchvision()
