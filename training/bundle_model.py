"""The MLflow model of a runroute bundle, logged as *code* ("models from code"), not as a pickle.

:func:`training.mlflow_log.log_training` logs this file as the model's ``python_model`` and the
``features`` and ``models`` packages as its ``code_paths``: MLflow copies all three into the model,
so loading it (``mlflow.pyfunc.load_model("models:/runroute-bundle@champion")``) needs neither this
checkout nor the ``training`` package, only the pinned requirements. MLflow executes this file at
load time; :func:`mlflow.models.set_model` names the model object.

Input: feature rows (columns = ``features.extract.FEATURE_NAMES``, float64); output: one row of
predictions per input row (``models.types.Predictions`` fields). The bundle directory is the
model's artifact ``bundle``, verified by ``ModelBundle.load`` when the model is loaded.
"""

from __future__ import annotations

import mlflow.models
import mlflow.pyfunc

__all__ = ["BundlePyfunc"]


class BundlePyfunc(mlflow.pyfunc.PythonModel):  # type: ignore[name-defined,misc]
    """pyfunc face of a bundle: input = feature rows, output = predictions."""

    # no type hints on these two: mlflow reads them to infer (and then warn about) a signature
    def load_context(self, context):  # type: ignore[no-untyped-def]
        from models.bundle import ModelBundle

        self.bundle = ModelBundle.load(context.artifacts["bundle"])

    def predict(self, context, model_input, params=None):  # type: ignore[no-untyped-def]
        import numpy as np
        import pandas as pd

        from features.extract import FEATURE_NAMES

        if isinstance(model_input, pd.DataFrame):
            model_input = model_input[list(FEATURE_NAMES)]
        X = np.asarray(model_input, dtype=np.float64)
        return pd.DataFrame([self.bundle.predict_features(x).as_dict() for x in X])


mlflow.models.set_model(BundlePyfunc())
