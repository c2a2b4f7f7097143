"""The package surface: `import gac` is light and every public verb resolves to a callable."""

import subprocess
import sys

import pytest

VERBS = ["compress", "select", "load", "save", "profile", "bench", "repair_dir", "heal_dir", "inspect_model",
         "register"]


@pytest.mark.subprocess
def test_import_gac_does_not_import_torch():
    code = "import sys, gac; assert 'torch' not in sys.modules, 'torch imported'"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


@pytest.mark.parametrize("name", VERBS)
def test_public_verbs_resolve(name):
    import gac

    assert callable(getattr(gac, name))


def test_unknown_attribute_is_an_attribute_error():
    import gac

    with pytest.raises(AttributeError):
        gac.no_such_verb  # noqa: B018
