"""A torchvision that cannot load next to the user's torch (what `pip install hptransfer` brings in
through mup, which never imports it) must not break hptransfer: transformers imports torchvision
whenever it finds one. The broken package here is a stand-in that fails its import exactly as the
real one does (`operator torchvision::nms does not exist`)."""

import subprocess
import sys
import textwrap


def test_hptransfer_hides_a_torchvision_that_cannot_load(tmp_path):
    pkg = tmp_path / "torchvision"
    pkg.mkdir()
    (pkg / "__init__.py").write_text('raise RuntimeError("operator torchvision::nms does not exist")\n')
    check = textwrap.dedent(
        """
        import importlib.util
        assert importlib.util.find_spec("torchvision") is not None  # installed, as after pip install
        import hptransfer
        assert importlib.util.find_spec("torchvision") is None
        from transformers.utils import is_torchvision_available
        assert not is_torchvision_available()
        from transformers import LlamaConfig, LlamaForCausalLM  # what the ladder builds
        LlamaForCausalLM(LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                     num_attention_heads=2, vocab_size=64))
        print("ok")
        """
    )
    p = subprocess.run(
        [sys.executable, "-c", check], env={"PYTHONPATH": f"{tmp_path}:platform", "PATH": ""}, capture_output=True, text=True
    )
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), p.stderr[-2000:]

    # Without hptransfer the same import of transformers' model fails: the stand-in is as broken as the real one.
    p = subprocess.run(
        [sys.executable, "-c", "from transformers import LlamaForCausalLM"],
        env={"PYTHONPATH": str(tmp_path), "PATH": ""},
        capture_output=True,
        text=True,
    )
    assert p.returncode != 0 and "torchvision::nms" in p.stderr
