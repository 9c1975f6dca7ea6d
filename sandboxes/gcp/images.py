"""The GCP sandbox's images and disks: public and test-published images, image families rolled out per zone,
and the boot disk an insert creates from its source image."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

from werkzeug.wrappers import Response

from sandboxes.faults import IMAGE_ACTION, FaultKind, FaultRegistry
from sandboxes.gcp import boot as gcp_boot
from sandboxes.gcp.state import _Request
from sandboxes.gcp.wire import ApiError, numeric_id
from sandboxes.server import json_response


class ImageHandlers:
    """Images and disks, mixed into ``GcpSandbox``."""

    faults: FaultRegistry
    _lock: threading.Lock
    _images: dict[tuple[str, str], gcp_boot.SeedImage]
    _image_zones: dict[tuple[str, str], frozenset[str] | None]
    _disks: dict[tuple[str, str, str], dict[str, Any]]
    _zone_or_404: Callable[[_Request], str]

    def _seed_images(self) -> None:
        self._images = {(i.project, i.name): i for i in gcp_boot.PUBLIC_IMAGES}
        self._image_zones = {}

    def add_image(
        self, project: str, name: str, *, family: str = "", disk_size_gb: int = 10, zones: Iterable[str] | None = None
    ) -> dict[str, Any]:
        """Publish an image (a buyer's own, say) until the next reset; ``zones`` limits where its family view sees
        it (None: everywhere). Returns the image as ``images.get`` answers it."""
        image = gcp_boot.SeedImage(project, name, family, disk_size_gb, f"{name}, added by a test")
        with self._lock:
            self._images[(project, name)] = image
            self._image_zones[(project, name)] = frozenset(zones) if zones is not None else None
        return gcp_boot.image_json(image)

    def _newest_in_family(self, project: str, family: str, zone: str | None) -> gcp_boot.SeedImage | None:
        """The newest image of a family (by name, as dated names sort), optionally rolled out in ``zone``."""
        found = [
            image
            for key, image in self._images.items()
            if key[0] == project and image.family == family and self._rolled_out(key, zone)
        ]
        return max(found, key=lambda i: i.name) if found else None

    def _rolled_out(self, key: tuple[str, str], zone: str | None) -> bool:
        zones = self._image_zones.get(key)
        return zone is None or zones is None or zone in zones

    def _image_fault(self, request: _Request, path: str) -> None:
        """An injected ``image_missing`` answers as GCP answers an image it does not have: 404 notFound."""
        region = request.zone.rsplit("-", 1)[0] if request.zone else None
        fault = self.faults.take(IMAGE_ACTION, (), request.zone, kinds={FaultKind.IMAGE_MISSING}, region=region)
        if fault is not None:
            raise gcp_boot.image_not_found(path)

    def _image_family_view(self, request: _Request) -> Response:
        """``imageFamilyViews.get``: the newest image of the family rolled out in the zone, as ``{"image": ...}``."""
        zone = self._zone_or_404(request)
        family = request.route["family"]
        path = gcp_boot.image_path(request.project, family=family)
        self._image_fault(request, path)
        with self._lock:
            image = self._newest_in_family(request.project, family, zone)
        if image is None:
            raise gcp_boot.image_not_found(path)
        return json_response({"image": gcp_boot.image_json(image)})

    def _images_from_family(self, request: _Request) -> Response:
        family = request.route["family"]
        path = gcp_boot.image_path(request.project, family=family)
        self._image_fault(request, path)
        with self._lock:
            image = self._newest_in_family(request.project, family, None)
        if image is None:
            raise gcp_boot.image_not_found(path)
        return json_response(gcp_boot.image_json(image))

    def _images_get(self, request: _Request) -> Response:
        path = gcp_boot.image_path(request.project, request.route["image"])
        self._image_fault(request, path)
        with self._lock:
            image = self._images.get((request.project, request.route["image"]))
        if image is None:
            raise gcp_boot.image_not_found(path)
        return json_response(gcp_boot.image_json(image))

    def _source_image(self, project: str, zone: str, source: str) -> gcp_boot.SeedImage | None:
        """The sandbox's image for a ``sourceImage``; None for one it never heard of (accepted as given, so a test
        may launch from a made-up image). Caller holds the lock."""
        parsed = gcp_boot.image_of_source(source, project)
        if parsed is None:
            return None
        image_project, name, family = parsed
        if family:
            return self._newest_in_family(image_project, family, zone)
        return self._images.get((image_project, name))

    def _boot_disk(self, project: str, zone: str, request: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
        """The Disk resource an insert creates for its boot disk; it keeps the image the request named, resolved
        to one image as GCP resolves a family. Caller holds the lock."""
        params = next((d.get("initializeParams") or {} for d in request.get("disks") or [] if d and d.get("boot")), {})
        source = str(params.get("sourceImage") or "")
        image = self._source_image(project, zone, source)
        link = gcp_boot.image_json(image)["selfLink"] if image is not None else source
        image_id = numeric_id("image", image.project, image.name) if image is not None else ""
        size = int(body["disks"][0]["diskSizeGb"])
        return gcp_boot.disk_json(project, zone, str(body["name"]), size, link, image_id)

    def _disks_get(self, request: _Request) -> Response:
        zone = self._zone_or_404(request)
        with self._lock:
            disk = self._disks.get((request.project, zone, request.route["disk"]))
        if disk is None:
            path = f"projects/{request.project}/zones/{zone}/disks/{request.route['disk']}"
            raise ApiError(404, f"The resource '{path}' was not found", "notFound")
        return json_response(disk)

    def disk_resource(self, zone: str, name: str) -> dict[str, Any]:
        """The boot disk an insert created (as ``disks.get`` answers it); KeyError if none."""
        with self._lock:
            for (_, z, n), disk in self._disks.items():
                if (z, n) == (zone, name):
                    return dict(disk)
        raise KeyError(f"{zone}/{name}")
