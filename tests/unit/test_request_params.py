"""Per-request AdaptiveSpec values: what is accepted, and that every bad one names its field."""

from __future__ import annotations

import math

import pytest

from vllm_adaptivespec.config import AdaptiveSpecConfig
from vllm_adaptivespec.engine.request_params import RequestParamError, request_tau

CONFIG = AdaptiveSpecConfig(tau=0.5, min_request_tau=0.2)


@pytest.mark.parametrize(
    "args, tau",
    [(None, 0.5), ({}, 0.5), ({"adaptivespec_tau": 0.7}, 0.7), ({"adaptivespec_tau": 1}, 1.0),
     ({"adaptivespec_lossless": True}, 1.0), ({"adaptivespec_lossless": 1, "adaptivespec_tau": 0.3}, 1.0),
     ({"adaptivespec_lossless": 0, "adaptivespec_tau": 0.3}, 0.3), ({"other_plugin_key": "x"}, 0.5)],
)
def test_accepted_values(args, tau):
    assert request_tau(args, CONFIG) == tau


@pytest.mark.parametrize(
    "args, named",
    [({"adaptivespec_tau": "0.5"}, "adaptivespec_tau"), ({"adaptivespec_tau": math.nan}, "adaptivespec_tau"),
     ({"adaptivespec_tau": -0.5}, "adaptivespec_tau"), ({"adaptivespec_tau": 1.5}, "adaptivespec_tau"),
     ({"adaptivespec_tau": 0.1}, "adaptivespec_tau"), ({"adaptivespec_tau": True}, "adaptivespec_tau"),
     ({"adaptivespec_tau": None}, "adaptivespec_tau"), ({"adaptivespec_lossless": 2}, "adaptivespec_lossless"),
     ({"adaptivespec_lossless": "yes"}, "adaptivespec_lossless"),
     ({"adaptivespec_lossless": 1.0}, "adaptivespec_lossless"),
     ({"adaptivespec_tua": 0.5}, "adaptivespec_tua"), ({"AdaptiveSpec_Tau": 0.5}, "AdaptiveSpec_Tau")],
    ids=str,
)
def test_bad_values_and_misspelled_keys_are_refused_naming_the_field(args, named):
    with pytest.raises(RequestParamError, match=named) as err:
        request_tau(args, CONFIG)
    assert err.value.key == named and isinstance(err.value, ValueError)
