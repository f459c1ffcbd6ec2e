"""The one display base (gpunb/display.py) on every result object: include/exclude honoured
(directly and through IPython's formatter), print() and the pretty printer give the text
view, to_dict() is plain JSON."""

from __future__ import annotations

import dataclasses
import enum
import json

import pytest
from IPython.core.interactiveshell import InteractiveShell
from IPython.lib.pretty import pretty

import gpunb
from gpunb.analysis.checks.checklist import check
from gpunb.analysis.fit.search import search
from gpunb.analysis.memory.oom import diagnose
from gpunb.analysis.profile.cell import ProfileSession
from gpunb.analysis.profile.records import HistoryReport
from gpunb.display import DisplayMixin, jsonable, register_views
from gpunb.readings.nvml import NvmlSession, Unavailable
from gpunb.shells import monitor as monitor_module
from gpunb.shells.kernel_state import STANDALONE_STATE
from gpunb.testing import scenario
from gpunb.testing.fake_nvml import load_trace
from tests.test_batch_fit import GiB, MiB, simulated_gpu


def _check_report():
    return check(nvml=NvmlSession(scenario("h200")), environ={}, quick=True, in_kernel=False)


def _cell_profile():
    session = ProfileSession(label="<display test>")
    session.start()
    sum(i * i for i in range(1000))
    return session.stop()


def _batch_fit():
    run, _ = simulated_gpu(20 * GiB, 40 * MiB, 120 * GiB, 0.04)
    fit = search(run, capacity=120 * GiB, start=2, max_batch=None)
    fit.device = "cuda:0"
    return fit


def _api_profile():
    with gpunb.profile(record=False, show=False) as p:
        sum(range(1000))
    return p


# name -> (builder, the mimetypes its view renders)
RESULTS = {
    "CheckReport": (_check_report, {"text/plain", "text/html"}),
    "CheckResult": (lambda: _check_report()["driver"], {"text/plain", "text/html"}),
    "CellProfile": (_cell_profile, {"text/plain", "text/html"}),
    "HistoryReport": (lambda: HistoryReport([_cell_profile(), _cell_profile()]), {"text/plain", "text/html"}),
    "profile": (_api_profile, {"text/plain", "text/html"}),
    "MemoryReport": (lambda: gpunb.memory(namespace={}), {"text/plain", "text/html"}),
    "OomDiagnosis": (lambda: diagnose(message=load_trace()["oom_message"]), {"text/plain", "text/html"}),
    "BatchFit": (_batch_fit, {"text/plain", "text/html"}),  # the curve is inside the HTML
    "BatchFit (failed)": (lambda: gpunb.fit_batch_size(42, progress=False), {"text/plain", "text/html"}),
    "Monitor": (lambda: gpunb.monitor(frontend="text"), {"text/plain", "text/html"}),
}


@pytest.fixture(params=list(RESULTS))
def result(request, fake_nvml):
    build, mimetypes = RESULTS[request.param]
    obj = build()
    yield obj, mimetypes
    monitor_module.stop_all(STANDALONE_STATE)


def test_the_bundle_has_the_views_and_honours_include_and_exclude(result):
    obj, mimetypes = result
    assert isinstance(obj, DisplayMixin)
    assert set(obj._repr_mimebundle_()) == mimetypes
    assert set(obj._repr_mimebundle_(include={"text/plain"})) == {"text/plain"}
    assert set(obj._repr_mimebundle_(exclude={"text/html"})) == mimetypes - {"text/html"}
    assert set(obj._repr_mimebundle_(include={"text/html", "image/png"}, exclude={"image/png"})) == {"text/html"}
    assert obj._repr_mimebundle_(include={"application/json"}) == {}


# A live monitor displays itself (_ipython_display_: the widget, then its snapshot bundle).
@pytest.mark.parametrize("name", [name for name in RESULTS if name != "Monitor"])
def test_ipython_asks_through_include_and_exclude(name, fake_nvml):
    obj = RESULTS[name][0]()
    formatter = InteractiveShell.instance().display_formatter
    data, _ = formatter.format(obj, include={"text/plain"})
    assert data == {"text/plain": str(obj)}
    data, _ = formatter.format(obj, exclude={"text/plain"})
    assert "text/plain" not in data and "text/html" in data


def test_print_and_the_pretty_printer_give_the_text_view(result, capsys):
    obj, _ = result
    text = obj._repr_mimebundle_(include={"text/plain"})["text/plain"]
    print(obj)
    assert capsys.readouterr().out == text + "\n"
    assert not text.startswith(type(obj).__name__ + "(")  # not the dataclass repr
    assert pretty(obj) == text


def test_the_pretty_printer_is_cycle_safe(result):
    obj, _ = result

    class Printer:
        def text(self, s):
            self.out = s

    printer = Printer()
    obj._repr_pretty_(printer, True)
    assert printer.out == f"{type(obj).__name__}(...)"


def test_to_dict_is_json_and_carries_the_fields(result):
    obj, _ = result
    data = obj.to_dict()
    json.dumps(data, allow_nan=False)  # plain JSON: no NaN, no objects
    if dataclasses.is_dataclass(obj) and type(obj).__name__ != "CheckReport":  # CheckReport: the --json contract
        assert {f.name for f in dataclasses.fields(obj)} <= set(data)


def test_check_report_json_keeps_its_documented_shape(fake_nvml):
    data = _check_report().to_dict()
    assert list(data) == ["summary", "ok", "verdict", "machine", "quick", "deep", "device", "duration_s", "checks"]
    assert data["checks"][0]["id"] == "driver" and isinstance(data["checks"][0]["measured"], dict)


def test_the_figure_is_drawn_only_when_the_html_is_asked_for(monkeypatch):
    from gpunb.views import fit_view

    drawn = []
    monkeypatch.setattr(fit_view, "fit_png", lambda f, dpi=100, title=True: drawn.append(f) or "cG5n")
    fit = _batch_fit()
    assert "text/html" not in fit._repr_mimebundle_(exclude={"text/html"}) and not drawn
    str(fit)
    assert not drawn
    assert "data:image/png;base64,cG5n" in fit._repr_mimebundle_(include={"text/html"})["text/html"]
    assert len(drawn) == 1


def test_an_unfinished_profile_says_how_to_use_it():
    p = gpunb.profile(record=False, show=False)
    assert str(p).startswith("gpunb.profile: not finished yet")
    assert p.to_dict() == {}


class _Color(enum.Enum):
    RED = "red"


@dataclasses.dataclass(frozen=True)
class _Inner:
    shape: tuple[int, ...]
    raw: bytes


def test_jsonable_turns_readings_into_plain_data():
    value = {
        "lost": Unavailable("GPU is lost", 15),
        "inner": _Inner((2, 3), b"GPU-\xff"),
        "nan": float("nan"),
        "inf": float("inf"),
        "set": {3, 1, 2},
        "color": _Color.RED,
        1: (1.5, None, True),
    }
    assert jsonable(value) == {
        "lost": "n/a (GPU is lost)",
        "inner": {"shape": [2, 3], "raw": "GPU-\ufffd"},
        "nan": None,
        "inf": None,
        "set": [1, 2, 3],
        "color": "red",
        "1": [1.5, None, True],
    }


def test_a_record_without_a_view_says_so():
    @dataclasses.dataclass
    class Bare(DisplayMixin):
        x: int = 1

    with pytest.raises(NotImplementedError, match="no view is registered for Bare"):
        str(Bare())
    assert Bare().to_dict() == {"x": 1}


def test_a_view_registered_for_a_record_type_shows_it_and_its_subclasses():
    @dataclasses.dataclass
    class Base(DisplayMixin):
        x: int = 1

    class Child(Base):
        pass

    register_views(Base, {"text/plain": lambda r: f"x is {r.x}", "text/html": lambda r: f"<b>{r.x}</b>"})
    assert str(Child(2)) == "x is 2"
    assert Child(3)._repr_mimebundle_(include=["text/html"]) == {"text/html": "<b>3</b>"}
    with pytest.raises(ValueError, match="need text/plain"):
        register_views(Base, {"text/html": lambda r: ""})
