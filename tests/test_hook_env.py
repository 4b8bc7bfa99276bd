"""``FMESH_TORCH_HOOK``: the usual spellings of on and off, and an error for the rest.

The switch is read when fmesh first hands out a DeviceMesh (``install``); a value it
cannot read is an error there, never silently on.
"""

from __future__ import annotations

import pytest

from fmesh._compat.hook import hook_enabled, install

OFF = ["0", "false", "off", "no", "False", "OFF", " no ", "No\n"]
ON = [None, "", "  ", "1", "true", "on", "yes", "TRUE", " On ", "Yes"]
BAD = ["2", "disable", "n", "y", "-1", "0 0", "offf", "none"]


@pytest.mark.parametrize("value", OFF)
def test_off_spellings(value: str) -> None:
    assert hook_enabled(value) is False


@pytest.mark.parametrize("value", ON)
def test_on_spellings_and_unset(value: str | None) -> None:
    assert hook_enabled(value) is True


@pytest.mark.parametrize("value", BAD)
def test_other_values_are_an_error_naming_value_and_spellings(value: str) -> None:
    with pytest.raises(ValueError) as info:
        hook_enabled(value)
    message = str(info.value)
    assert message.startswith(f"FMESH_TORCH_HOOK={value!r} is not a switch: ")
    assert "0, false, off, no turn the routing" in message
    assert "1, true, on, yes (or unset, the default) keep it on" in message


def test_install_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    # Off before anything is touched: no torch import, nothing wrapped.
    monkeypatch.setenv("FMESH_TORCH_HOOK", " Off ")
    assert install() is False
    monkeypatch.setenv("FMESH_TORCH_HOOK", "disabled")
    with pytest.raises(ValueError, match=r"FMESH_TORCH_HOOK='disabled' is not a switch"):
        install()


def test_the_peer_watch_is_on_unless_switched_off(monkeypatch: pytest.MonkeyPatch) -> None:
    from fmesh._protocol import liveness

    monkeypatch.delenv("FMESH_PEER_WATCH", raising=False)
    assert liveness.enabled() is True
    monkeypatch.setenv("FMESH_PEER_WATCH", "Off")
    assert liveness.enabled() is False
    monkeypatch.setenv("FMESH_PEER_WATCH", "sometimes")
    with pytest.raises(ValueError, match=r"FMESH_PEER_WATCH='sometimes' is not a switch"):
        liveness.enabled()
