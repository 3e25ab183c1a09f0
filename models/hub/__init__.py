"""Hub publishing: flat remote code generated from the package, model cards, the upload folder and the upload.

`scripts/publish.py` is the command line over [`assemble`] and [`upload`]; the README's "Publishing" and
`scripts/README.md` explain the workflow and both ways of loading a published model.
"""

from .card import CardError, CardInfo, RunMetrics, load_metrics, parse_metrics, render_model_card
from .publish import Assembled, PublishError, PublishOptions, assemble, upload
from .remote_code import AUTO_CLASSES, RemoteCode, RemoteCodeError, generate_remote_code

__all__ = [
    "AUTO_CLASSES",
    "Assembled",
    "CardError",
    "CardInfo",
    "PublishError",
    "PublishOptions",
    "RemoteCode",
    "RemoteCodeError",
    "RunMetrics",
    "assemble",
    "generate_remote_code",
    "load_metrics",
    "parse_metrics",
    "render_model_card",
    "upload",
]
