"""Sluice for Python: the GPU client as a PyTorch-style loader.

::

    loader = sluice.Loader(dataset="manifest.json", workers=["cpu-0:7100"], batch_size=256,
                           token_file="token", trust_cert="cert.pem",
                           fields=["txt", "json"], label="cls")
    for images, labels in loader.epoch(0):
        x = torch.from_dlpack(images)          # N×H×W×3 uint8, no copy
        captions = images.fields["txt"]        # one str per row
        boxes, keep = sluice.transform_boxes(images.fields["json"][0]["boxes"],
                                             images.geometry[0])

Batches leave through DLPack, so ``torch.from_dlpack`` and ``numpy.from_dlpack`` wrap the
loader's own buffer; see ``help(sluice.Loader)`` for the buffer lifetime rule, checkpoints
and devices. Beside the tensors each batch carries, in the same plan order: ``images.keys``
(WebDataset's ``__key__``), ``images.ids``, ``images.padding``, ``images.skipped``,
``images.fields`` (the fields the loader asked for, decoded by extension as WebDataset does)
and ``images.geometry`` (the crop box and flip that made each tensor).

PyTorch code that wants tensors in dicts, epochs that advance on every ``iter()`` (and under
Lightning's ``sampler.set_epoch``), ``len``, ``state_dict``/``load_state_dict`` and pickling,
uses :mod:`sluice.torch` (it imports torch; this module does not).
``sluice.serve_metrics("0.0.0.0:9400")`` serves the client's metrics for Prometheus.
"""

from importlib.metadata import PackageNotFoundError, version

from ._fields import FieldDecodeError, Fields, decode_field
from ._geometry import transform_boxes
from ._loader import Loader
from ._sluice import Epoch, Images, Labels, SluiceError, Tensor, serve_metrics

try:
    __version__ = version("sluice")
except PackageNotFoundError:  # imported from a source tree, not installed
    __version__ = "0+unknown"

__all__ = [
    "__version__",
    "Epoch",
    "FieldDecodeError",
    "Fields",
    "Images",
    "Labels",
    "Tensor",
    "Loader",
    "SluiceError",
    "decode_field",
    "serve_metrics",
    "transform_boxes",
]
