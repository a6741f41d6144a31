"""The first download of the default model, through the real pip against a local wheel of the same
name and layout (PIP_NO_INDEX + PIP_FIND_LINKS: no network): the steps it reports on stderr, and
silence when asked."""
import base64
import hashlib
import os
import zipfile

import pytest

from dashinfer_client import default_model


def _fake_wheel(folder, payload: bytes) -> str:
    """A wheel of the default model's package holding `payload` as its GGUF, RECORD included."""
    name, version = default_model.PACKAGE.split("==")
    dist = f"{name.replace('-', '_')}-{version}"
    path = os.path.join(folder, f"{dist}-py3-none-any.whl")
    members = {default_model.GGUF_MEMBER: payload,
               f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
               f"{dist}.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = ""
    for member, data in members.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record += f"{member},sha256={digest},{len(data)}\n"
    record += f"{dist}.dist-info/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as wheel:
        for member, data in members.items():
            wheel.writestr(member, data)
        wheel.writestr(f"{dist}.dist-info/RECORD", record)
    return path


@pytest.fixture
def local_index(tmp_path, monkeypatch):
    links = tmp_path / "links"
    links.mkdir()
    payload = os.urandom(4096)
    _fake_wheel(str(links), payload)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    monkeypatch.delenv("DASHINFER_QUIET", raising=False)
    return payload


def test_first_download_reports_each_step_and_pips_own_lines(tmp_path, local_index, capsys):
    path = default_model.default_model_path(str(tmp_path / "cache"))
    assert open(path, "rb").read() == local_index
    err = capsys.readouterr().err.splitlines()
    steps = [line for line in err if line.startswith("dashinfer: [")]
    assert steps[0].startswith(f"dashinfer: [1/3] first use of the default model: downloading {default_model.PACKAGE}")
    assert steps[1].startswith("dashinfer: [2/3] extracting")
    pip_lines = [line for line in err if line.startswith("dashinfer:   pip: ")]
    assert any("Saved" in line for line in pip_lines), err  # pip's own report, not -q silence
    # cached: nothing more to say
    assert default_model.default_model_path(str(tmp_path / "cache")) == path
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("quiet", ["progress=False", "DASHINFER_QUIET=1"])
def test_download_is_silent_when_asked(tmp_path, local_index, capsys, monkeypatch, quiet):
    if quiet == "DASHINFER_QUIET=1":
        monkeypatch.setenv("DASHINFER_QUIET", "1")
        path = default_model.default_model_path(str(tmp_path / "cache"))
    else:
        path = default_model.default_model_path(str(tmp_path / "cache"), progress=False)
    assert open(path, "rb").read() == local_index
    assert capsys.readouterr().err == ""


def test_a_failed_download_says_what_pip_said(tmp_path, monkeypatch):
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))  # no wheel there
    with pytest.raises(default_model.ModelSerializerException, match="could not download the default model"):
        default_model.default_model_path(str(tmp_path / "cache"), progress=True)
