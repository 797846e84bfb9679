"""A kernel file never runs under a name it did not earn: a NAME that is (or reads as) a registered backend's, or
that of another selected kernel file, is refused before anything runs, with the fix. On 6cf3c74 a file with
NAME = "numpy" was recorded as numpy beside the real one (resume keys, compare and history mixed the two)."""
from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from kbench.cli import cli
from kbench.errors import BadInput
from kbench.kernelfile import KernelFileRef
from kbench.plugins import PluginManager

BODY = '''
def attention(q, k, v, out, *, causal, scale):
    out[...] = 0
'''
SUITE = """version: 1
name: names
op: attention
backends: ["numpy"]
grid:
  - {batch: 1, seqlen: 16, heads: 1, head_dim: 16, causal: false, dtype: fp32}
"""


@pytest.fixture(scope="module")
def registry():
    return PluginManager(load_entry_points=False).registry


def kernel(path: Path, name: str | None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text((f"NAME = {name!r}\n" if name is not None else "") + BODY)
    return path


@pytest.mark.parametrize("name", ["numpy", "NumPy", "ｎｕｍｐｙ", " numpy-flash ", "numpy-flash[block_q=64]",
                                  "numpy-flash[x]"])
def test_a_name_that_reads_as_a_registered_backend_is_refused(tmp_path, registry, name):
    with pytest.raises(BadInput) as info:
        KernelFileRef(kernel(tmp_path / "k.py", name), registry)
    assert info.value.where == "NAME" and info.value.file.endswith("k.py")
    assert "NAME" in info.value.fix


def test_a_name_of_its_own_is_kept_and_unsafe_characters_are_escaped(tmp_path, registry):
    assert KernelFileRef(kernel(tmp_path / "k.py", "my-numpy"), registry).name == "my-numpy"
    assert KernelFileRef(kernel(tmp_path / "k.py", None), registry).name == "file:k"
    assert KernelFileRef(kernel(tmp_path / "k.py", "tuned:v2@sm90,bq=64"), registry).name == "tuned:v2@sm90,bq=64"


@pytest.mark.parametrize("name, odd", [("numрy", "U+0440"), ("numpy\u2011flash", "U+2011"), ("ypmun\u202e", "U+202E"),
                                       ("my kernel", "U+0020"), ("ｍｙ", "U+FF4D")])
def test_a_name_beyond_ascii_letters_digits_and_marks_is_refused_with_the_character_named(tmp_path, registry, name,
                                                                                           odd):
    """Look-alikes: a Cyrillic р, a non-breaking hyphen (U+2011), a bidi override, fullwidth letters."""
    with pytest.raises(BadInput) as info:
        KernelFileRef(kernel(tmp_path / "k.py", name), registry)
    assert info.value.where == "NAME" and odd in info.value.message and "ASCII" in info.value.fix


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.mark.parametrize("names", [("same", "same"), ("same", "SAME"), (None, None)])
def test_two_selected_kernel_files_of_one_name_are_refused_before_the_run(tmp_path, names):
    suite = tmp_path / "suite.yaml"
    suite.write_text(SUITE)
    a = kernel(tmp_path / "a" / "kern.py", names[0])
    b = kernel(tmp_path / "b" / "kern.py", names[1])
    ran = invoke("run", suite, "-b", a, "-b", b, "-o", tmp_path / "r.json")
    assert ran.exit_code == 2, ran.output
    assert "read as one name" in ran.output and "NAME of its own" in ran.output
    assert not (tmp_path / "r.json").exists()


def test_a_file_named_as_a_registered_backend_is_refused_by_run(tmp_path):
    suite = tmp_path / "suite.yaml"
    suite.write_text(SUITE)
    ran = invoke("run", suite, "-b", "numpy", "-b", kernel(tmp_path / "k.py", "numpy"), "-o", tmp_path / "r.json")
    assert ran.exit_code == 2 and "is the registered backend 'numpy'" in ran.output, ran.output


def test_a_backend_given_beside_a_registered_one_of_its_name_is_refused(registry):
    from kbench.selection import refuse_name_collisions

    numpy = registry.backends["numpy"]
    impostor = type(numpy)()  # another object, trusted=False or not: it did not earn the registered name
    impostor.trusted = False
    with pytest.raises(BadInput, match="both named 'numpy'"):
        refuse_name_collisions([numpy, impostor])
    refuse_name_collisions([numpy, registry.backends["numpy-flash"]])  # distinct names pass


def test_a_name_given_by_trusted_code_is_not_held_against_the_registry(tmp_path, registry):
    """A worker rebuilds a kernel file under the name the parent decided, and a plugin registers evolved versions
    under names it chose: the worker's registry may hold that very name (the evolve plugin scans its workspace
    there too), which must not refuse the file it names."""
    path = kernel(tmp_path / "k.py", "numpy")
    assert KernelFileRef(path, registry, name="numpy-flash").name == "numpy-flash"
    assert KernelFileRef(path, registry, name="x\ud800").name == "x\\ud800"


def test_two_settings_of_one_kernel_file_are_two_names(tmp_path, registry):
    """A tuning sweep selects one kernel file under several settings (scripts/gpu-check's tuning and training
    stages: ``triton[...]`` beside ``triton``): each is a name the file earned; another file of that NAME is not."""
    from kbench.selection import refuse_name_collisions

    import copy

    tuned = KernelFileRef(kernel(tmp_path / "tuned.py", "tuned"), registry)
    variants = [tuned]
    for block in (32, 16):  # what Backend.configure makes of a registered kernel file's settings
        variant = copy.copy(tuned)
        variant.name, variant.base_name = f"tuned[block={block}]", "tuned"
        variants.append(variant)
    refuse_name_collisions(variants)  # one file, three settings: no refusal
    other = KernelFileRef(kernel(tmp_path / "other" / "k.py", "tuned"), registry)
    with pytest.raises(BadInput, match="read as one name"):
        refuse_name_collisions(variants + [other])
