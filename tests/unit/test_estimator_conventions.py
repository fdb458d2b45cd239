"""scikit-learn's own API checks on every predictor (DESIGN.md, example 7).

Our estimators take tables with named columns (jobs, GPU types), not bare arrays, so sklearn's
data checks do not apply; its API checks do: keyword-only __init__ that only stores, params
that round-trip through get_params/set_params and clone, nothing fitted until fit().
"""

from __future__ import annotations

import pytest
from sklearn.base import clone
from sklearn.utils import estimator_checks as checks

from slurm_gpushare.predict.estimators import (CrossTypeMemoryPredictor, InterferenceClasses,
                                               PairSpeedModel, RuntimeTransfer)

ESTIMATORS = [InterferenceClasses, CrossTypeMemoryPredictor, RuntimeTransfer, PairSpeedModel]
API_CHECKS = [
    checks.check_no_attributes_set_in_init,
    checks.check_parameters_default_constructible,
    checks.check_get_params_invariance,
    checks.check_set_params,
    checks.check_estimator_repr,
    checks.check_do_not_raise_errors_in_init_or_set_params,
]


@pytest.mark.parametrize("check", API_CHECKS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("estimator", ESTIMATORS, ids=lambda e: e.__name__)
def test_sklearn_api_checks(estimator, check):
    check(estimator.__name__, estimator())


@pytest.mark.parametrize("estimator", ESTIMATORS, ids=lambda e: e.__name__)
def test_keyword_only_and_clone_keeps_params(estimator):
    with pytest.raises(TypeError):
        estimator(1)  # positional parameters are refused
    params = estimator().get_params()
    assert clone(estimator(**params)).get_params() == params
