"""Model files: the lynx_model() convention, the module-level fallback, and clear errors."""

import textwrap

import pytest
import torch

from lynx_planner.io import InputError
from lynx_planner.profiler import load_model_file


def write(tmp_path, text: str):
    path = tmp_path / "m.py"
    path.write_text(textwrap.dedent(text))
    return path


def test_lynx_model_gets_accepted_overrides(tmp_path):
    path = write(tmp_path, """
        import torch
        def lynx_model(seq_len=4):
            return torch.nn.Linear(3, 3), torch.zeros(seq_len, 3)
    """)
    module, inputs = load_model_file(path, seq_len=7, batch_size=2)
    assert isinstance(module, torch.nn.Linear) and inputs[0].shape == (7, 3)


def test_module_level_fallback_converted_like_training(tmp_path):
    """model.to(dtype) converts parameters and floating buffers (an fp32 table included) and floating inputs; the
    default dtype is never changed, so the file builds what it builds in training."""
    path = write(tmp_path, """
        import torch
        assert torch.get_default_dtype() == torch.float32
        model = torch.nn.Linear(3, 3)
        model.register_buffer("table", torch.arange(4).float())
        example_inputs = (torch.zeros(2, 3), torch.zeros(2, dtype=torch.long))
    """)
    module, inputs = load_model_file(path, dtype="bf16")
    assert module.weight.dtype == module.table.dtype == inputs[0].dtype == torch.bfloat16
    assert inputs[1].dtype == torch.long and torch.get_default_dtype() == torch.float32
    module, inputs = load_model_file(path)
    assert module.weight.dtype == inputs[0].dtype == torch.float32


def test_module_level_fallback_refuses_overrides_it_cannot_take(tmp_path):
    path = write(tmp_path, """
        import torch
        model = torch.nn.Linear(3, 3)
        example_inputs = (torch.zeros(2, 3),)
    """)
    load_model_file(path, seq_len=7)  # not asked for explicitly: ignored
    with pytest.raises(InputError, match="does not accept seq_len .*module-level model/example_inputs"):
        load_model_file(path, strict=("seq_len",), seq_len=7)


def test_sys_exit_in_model_file(tmp_path):
    with pytest.raises(InputError, match="called sys.exit\\(0\\)"):
        load_model_file(write(tmp_path, "import sys\nsys.exit(0)\n"))


def test_missing_file(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        load_model_file(tmp_path / "nope.py")


def test_no_model(tmp_path):
    with pytest.raises(InputError, match="defines neither lynx_model\\(\\) nor model/example_inputs"):
        load_model_file(write(tmp_path, "x = 1\n"))


def test_user_exception_names_user_line(tmp_path):
    path = write(tmp_path, """
        def lynx_model():
            return helper()

        def helper():
            raise ValueError("bad config")
    """)
    with pytest.raises(InputError) as err:
        load_model_file(path)
    assert str(err.value) == f"{path}:6: ValueError: bad config"


def test_syntax_error(tmp_path):
    with pytest.raises(InputError, match=r"m.py:1: SyntaxError"):
        load_model_file(write(tmp_path, "def (:\n"))


def test_required_override(tmp_path):
    path = write(tmp_path, """
        import torch
        def lynx_model():
            return torch.nn.Linear(3, 3), (torch.zeros(2, 3),)
    """)
    with pytest.raises(InputError, match="does not accept attention"):
        load_model_file(path, strict=("attention",), attention="math")


def test_dtype_casts_floating_tensors_and_keeps_complex_buffers(tmp_path):
    """--dtype bf16 casts weights and floating buffers; a complex buffer (torchtitan's rotary cache) stays complex,
    where Module.to(dtype) would drop its imaginary part."""
    path = write(tmp_path, """
        import torch
        def lynx_model():
            m = torch.nn.Linear(3, 3)
            m.register_buffer("rope", torch.polar(torch.ones(4), torch.arange(4.0)))
            m.register_buffer("scale", torch.ones(3))
            return m, (torch.zeros(2, 3),)
    """)
    module, inputs = load_model_file(path, dtype="bf16")
    assert module.weight.dtype == module.scale.dtype == inputs[0].dtype == torch.bfloat16
    assert module.rope.dtype == torch.complex64 and module.rope.imag.abs().sum() > 0
