"""One Vulkan device: instance, physical device choice, logical device and compute queue,
memory types, limits, and the DeviceInfo a worker reports (device class from ids and name).

Validation: FLEETTUNE_VK_VALIDATION=1 enables VK_LAYER_KHRONOS_validation with synchronization
validation (missing barriers are reported) and collects its errors in ``Device.messages``.
``open_device(index)`` opens the loader's physical device ``index`` (``physical_devices()``
lists them without opening any); None picks discrete > integrated > others. Nothing here reads
the environment for the choice: entry points pass the index (engine.backends.default_device).
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field
from typing import Any

from engine.backends.vulkan import coopmat
from engine.backends.vulkan._vk import ffi, vk
from engine.device_info import DeviceInfo, class_slug
from engine.errors import BackendUnavailable, ConfigError

log = logging.getLogger(__name__)

VENDORS = {0x10DE: "nvidia", 0x1002: "amd", 0x8086: "intel", 0x10005: "mesa", 0x13B5: "arm"}
VALIDATION_LAYER = "VK_LAYER_KHRONOS_validation"
STATS_EXTENSION = "VK_KHR_pipeline_executable_properties"


def device_class(vendor_id: int, name: str) -> str:
    """A stable short name for a kind of device: studies and promoted configs are keyed by it."""
    low = name.lower()
    if "llvmpipe" in low or "lavapipe" in low:
        return "llvmpipe"
    base = re.sub(r"\(.*?\)", " ", name)  # drop "(RADV GFX1201)" and the like
    if vendor_id == 0x10DE or low.startswith("nvidia"):
        words = [
            w
            for w in re.split(r"[\s\-_]+", base)
            if w
            and w.lower() not in ("nvidia", "geforce", "tesla", "quadro", "gpu", "graphics")
            and not re.fullmatch(r"(pcie|sxm\d*|nvl|hbm\d*e?|\d+gb)", w.lower())
        ]
        # "RTX 4090" -> rtx4090, "H200" -> h200, "RTX A6000" -> rtx-a6000
        model = ""
        for w in words:
            if model and (w.isdigit() or re.fullmatch(r"(ti|super)", w.lower())):
                model += w.lower()
            else:
                model += ("-" if model else "") + w.lower()
        return class_slug("nvidia-" + model) if model else "nvidia"
    if vendor_id == 0x1002 or "radeon" in low or low.startswith("amd"):
        m = re.search(r"\b(r\d{4})\b", base, re.I)  # Radeon AI PRO R9700 -> r9700
        if m:
            return m.group(1).lower()
        m = re.search(r"\bRX\s*(\d{3,4})\s*(XTX|XT|GRE)?\b", base, re.I)  # RX 9070 XT -> rx9070xt
        if m:
            return ("rx" + m.group(1) + (m.group(2) or "")).lower()
    return class_slug(base)


def driver_version_str(vendor_id: int, v: int) -> str:
    if vendor_id == 0x10DE:  # NVIDIA packs 10.8.8.6 bits
        return f"{(v >> 22) & 0x3FF}.{(v >> 14) & 0xFF}.{(v >> 6) & 0xFF}"
    return f"{v >> 22}.{(v >> 12) & 0x3FF}.{v & 0xFFF}"


@dataclass
class MemoryTypes:
    device: int  # for tensors and weights
    host: int  # host-visible + coherent (cached where offered): staging, downloads
    unified: bool  # `device` is host-visible too: upload by memcpy, no staging copies
    # device-local + host-visible + coherent (a BAR window, resizable BAR, unified memory): small
    # buffers the CPU writes and the GPU reads each submit (dynamic scalars); None: `host`
    near: int | None = None


@dataclass
class Device:
    instance: Any
    physical: Any
    device: Any
    queue: Any
    queue_family: int
    props: Any
    mem: MemoryTypes
    info: DeviceInfo
    timestamp_bits: int
    timestamp_period: float
    max_range: int
    subgroup_control: bool
    full_subgroups: bool
    messages: list[str] = field(default_factory=list)
    _messenger: Any = None
    _keep: list[Any] = field(default_factory=list)

    def destroy(self) -> None:
        if self.device is not None:
            vk.vkDeviceWaitIdle(self.device)
            vk.vkDestroyDevice(self.device, None)
            self.device = None
        if self._messenger is not None:
            fn = vk.vkGetInstanceProcAddr(self.instance, "vkDestroyDebugUtilsMessengerEXT")
            fn(self.instance, self._messenger, None)
            self._messenger = None
        if self.instance is not None:
            vk.vkDestroyInstance(self.instance, None)
            self.instance = None


def validation_requested() -> bool:
    return os.environ.get("FLEETTUNE_VK_VALIDATION", "") not in ("", "0")


def _create_instance(validation: bool, messages: list[str]) -> tuple[Any, Any]:
    try:
        api = vk.vkEnumerateInstanceVersion()
    except Exception:  # noqa: BLE001 - a 1.0 loader has no vkEnumerateInstanceVersion
        api = vk.VK_MAKE_VERSION(1, 0, 0)
    if api < vk.VK_MAKE_VERSION(1, 2, 0):
        raise BackendUnavailable("the Vulkan loader is older than 1.2; the backend needs 1.2+")
    app = vk.VkApplicationInfo(
        pApplicationName="fleettune",
        applicationVersion=1,
        pEngineName="fleettune",
        engineVersion=1,
        apiVersion=min(api, vk.VK_MAKE_VERSION(1, 3, 0)),
    )
    layers, exts, pnext = [], [], None
    if validation:
        have = {lp.layerName for lp in vk.vkEnumerateInstanceLayerProperties()}
        if VALIDATION_LAYER not in have:
            raise BackendUnavailable(
                f"FLEETTUNE_VK_VALIDATION is set but {VALIDATION_LAYER} is not installed "
                "(apt install vulkan-validationlayers)"
            )
        layers.append(VALIDATION_LAYER)
        exts.append(vk.VK_EXT_DEBUG_UTILS_EXTENSION_NAME)
        pnext = vk.VkValidationFeaturesEXT(
            pEnabledValidationFeatures=[
                vk.VK_VALIDATION_FEATURE_ENABLE_SYNCHRONIZATION_VALIDATION_EXT
            ],
        )
    info = vk.VkInstanceCreateInfo(
        pNext=pnext,
        pApplicationInfo=app,
        ppEnabledLayerNames=layers or None,
        ppEnabledExtensionNames=exts or None,
    )
    try:
        instance = vk.vkCreateInstance(info, None)
    except vk.VkError as e:
        raise BackendUnavailable(f"vkCreateInstance failed: {type(e).__name__}") from None
    messenger = None
    if validation:

        def callback(severity: int, types: int, data: Any, user: Any) -> int:
            msg = ffi.string(data.pMessage).decode("utf-8", "replace")
            if severity & vk.VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT:
                messages.append(msg)
                log.error("vulkan validation: %s", msg)
            elif severity & vk.VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT:
                log.warning("vulkan validation: %s", msg)
            return 0

        create = vk.vkGetInstanceProcAddr(instance, "vkCreateDebugUtilsMessengerEXT")
        messenger = create(
            instance,
            vk.VkDebugUtilsMessengerCreateInfoEXT(
                messageSeverity=vk.VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT
                | vk.VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT,
                messageType=vk.VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT
                | vk.VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT
                | vk.VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT,
                pfnUserCallback=callback,
            ),
            None,
        )
    return instance, messenger


_RANK = {  # which kind of device a node serves when it has several kinds
    vk.VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: 0,
    vk.VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: 1,
    vk.VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: 2,
    vk.VK_PHYSICAL_DEVICE_TYPE_CPU: 3,
}


_KIND = {0: "discrete", 1: "integrated", 2: "virtual", 3: "cpu", 4: "other"}  # by _RANK


@dataclass(frozen=True)
class Physical:
    """A physical device as the loader enumerates it (``index`` is what open_device takes)."""

    index: int
    name: str
    device_class: str
    rank: int  # 0 discrete, 1 integrated, 2 virtual, 3 CPU (llvmpipe), 4 other
    driver: str = ""
    memory_bytes: int = 0

    @property
    def kind(self) -> str:
        return _KIND.get(self.rank, "other")


def physical_devices() -> list[Physical]:
    """Every physical device, without opening any (a bare instance, destroyed again)."""
    instance, _ = _create_instance(False, [])
    try:
        out = []
        for i, d in enumerate(vk.vkEnumeratePhysicalDevices(instance)):
            p = vk.vkGetPhysicalDeviceProperties(d)
            name = p.deviceName if isinstance(p.deviceName, str) else ffi.string(p.deviceName)
            drv = vk.VkPhysicalDeviceDriverProperties(
                sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES
            )
            p2 = vk.VkPhysicalDeviceProperties2(
                sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, pNext=drv
            )
            vk.vkGetPhysicalDeviceProperties2(d, p2)
            driver = f"{_cstr(drv.driverName)} {_cstr(drv.driverInfo)}".strip()
            out.append(
                Physical(
                    i,
                    name,
                    device_class(p.vendorID, name),
                    _RANK.get(p.deviceType, 4),
                    driver or driver_version_str(p.vendorID, p.driverVersion),
                    _local_heap_bytes(d),
                )
            )
        return out
    finally:
        vk.vkDestroyInstance(instance, None)


def _local_heap_bytes(physical: Any) -> int:
    """The largest device-local memory heap."""
    mp = vk.vkGetPhysicalDeviceMemoryProperties(physical)
    return max(
        (
            int(mp.memoryHeaps[i].size)
            for i in range(mp.memoryHeapCount)
            if mp.memoryHeaps[i].flags & vk.VK_MEMORY_HEAP_DEVICE_LOCAL_BIT
        ),
        default=0,
    )


def _pick_physical(instance: Any, index: int | None) -> tuple[int, Any]:
    devices = vk.vkEnumeratePhysicalDevices(instance)
    if not devices:
        raise BackendUnavailable("no Vulkan device found (is a driver / ICD installed?)")
    if index is not None:
        if not 0 <= index < len(devices):
            raise ConfigError(
                f"vulkan device {index}: no such device; choose an index 0..{len(devices) - 1} "
                "(python -m engine devices lists them)"
            )
        return index, devices[index]
    ranks = [_RANK.get(vk.vkGetPhysicalDeviceProperties(d).deviceType, 4) for d in devices]
    best = ranks.index(min(ranks))
    return best, devices[best]


def rebar_requested() -> bool:
    """FLEETTUNE_VK_REBAR=1: a discrete GPU's tensors in host-visible device memory (resizable
    BAR) as before 2026-12-01, for A/B runs (see _memory_types)."""
    return os.environ.get("FLEETTUNE_VK_REBAR", "") not in ("", "0")


def _memory_types(physical: Any, discrete: bool = False) -> MemoryTypes:
    mp = vk.vkGetPhysicalDeviceMemoryProperties(physical)
    types = [
        (i, int(mp.memoryTypes[i].propertyFlags), int(mp.memoryTypes[i].heapIndex))
        for i in range(mp.memoryTypeCount)
    ]
    heaps = [int(mp.memoryHeaps[i].size) for i in range(mp.memoryHeapCount)]
    return choose_memory_types(types, heaps, discrete)


def choose_memory_types(
    types: list[tuple[int, int, int]], heaps: list[int], discrete: bool
) -> MemoryTypes:
    """The memory types to use, from (index, property flags, heap) per type and heap sizes."""
    dl, hv, hc, cached = (
        vk.VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT,
        vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT,
        vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT,
        vk.VK_MEMORY_PROPERTY_HOST_CACHED_BIT,
    )
    local = [t for t in types if t[1] & dl]
    biggest = max((heaps[t[2]] for t in local), default=0)
    near = next((i for i, f, _ in local if f & hv and f & hc), None)
    # Unified: host-visible device-local memory as large as the device's biggest heap (lavapipe,
    # integrated GPUs). Not on a discrete GPU with resizable BAR: on the H200 (NVIDIA 580)
    # every GEMM after the probe's first download through a BAR mapping ran 4x slower (2.1 ->
    # 8.4 ms; docs/BENCHMARKS.md), and downloads read uncached over PCIe; tensors live in
    # device-only memory there and move through staging copies, as most Vulkan engines do.
    if not discrete or rebar_requested():
        for i, flags, heap in local:
            if flags & hv and flags & hc and heaps[heap] >= 0.9 * biggest:
                return MemoryTypes(i, i, True, i)
    # the first device-only type of the biggest heap (device-local + host-visible as a fallback)
    device = (
        min(local, key=lambda t: (-heaps[t[2]], bool(t[1] & hv), t[0]))[0] if local else types[0][0]
    )
    sysmem = [(i, f) for i, f, _ in types if f & hv and f & hc and not f & dl]
    if not sysmem:
        sysmem = [(i, f) for i, f, _ in types if f & hv and f & hc]
    host = min(sysmem, key=lambda t: (not t[1] & cached, t[0]))[0]  # cached: CPU reads
    return MemoryTypes(device, host, False, near)


def open_device(index: int | None = None) -> Device:
    """Create the instance and the logical device of physical device ``index`` (None: the
    best kind present) with one compute queue."""
    messages: list[str] = []
    validation = validation_requested()
    instance, messenger = _create_instance(validation, messages)
    try:
        return _open(instance, messenger, messages, index)
    except Exception:
        vk.vkDestroyInstance(instance, None)
        raise


def _open(instance: Any, messenger: Any, messages: list[str], index: int | None) -> Device:
    index, physical = _pick_physical(instance, index)
    props = vk.vkGetPhysicalDeviceProperties(physical)
    if props.apiVersion < vk.VK_MAKE_VERSION(1, 2, 0):
        raise BackendUnavailable(
            f"{props.deviceName}: Vulkan {props.apiVersion >> 22}."
            f"{(props.apiVersion >> 12) & 0x3FF} < 1.2"
        )
    exts = {e.extensionName for e in vk.vkEnumerateDeviceExtensionProperties(physical, None)}
    more = _properties(physical, exts)
    feats = _features(instance, physical, exts)
    families = vk.vkGetPhysicalDeviceQueueFamilyProperties(physical)
    qf = _compute_queue_family(families, props.deviceName)
    qinfo = vk.VkDeviceQueueCreateInfo(queueFamilyIndex=qf, queueCount=1, pQueuePriorities=[1.0])
    dinfo = vk.VkDeviceCreateInfo(
        pNext=feats.chain,
        pQueueCreateInfos=[qinfo],
        ppEnabledExtensionNames=feats.extensions or None,
    )
    try:
        device = vk.vkCreateDevice(physical, dinfo, None)
    except vk.VkError as e:
        raise BackendUnavailable(
            f"{props.deviceName}: vkCreateDevice failed ({type(e).__name__})"
        ) from None
    queue = vk.vkGetDeviceQueue(device, qf, 0)
    mem = _memory_types(physical, props.deviceType == vk.VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU)
    lim = props.limits
    info = _device_info(physical, props, more, feats, mem, messenger is not None, index)
    return Device(
        instance=instance,
        physical=physical,
        device=device,
        queue=queue,
        queue_family=qf,
        props=props,
        mem=mem,
        info=info,
        timestamp_bits=int(families[qf].timestampValidBits),
        timestamp_period=float(lim.timestampPeriod),
        max_range=int(lim.maxStorageBufferRange),
        subgroup_control=feats.subgroup_control,
        full_subgroups=feats.full_subgroups,
        messages=messages,
        _messenger=messenger,
    )


@dataclass
class _MoreProperties:
    """vkGetPhysicalDeviceProperties2's answers beyond the plain properties."""

    driver: Any  # VkPhysicalDeviceDriverProperties
    subgroup: Any  # VkPhysicalDeviceSubgroupProperties
    size_control: Any  # VkPhysicalDeviceSubgroupSizeControlProperties, None without the extension


def _properties(physical: Any, exts: set[str]) -> _MoreProperties:
    sg = vk.VkPhysicalDeviceSubgroupProperties(
        sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES
    )
    drv = vk.VkPhysicalDeviceDriverProperties(
        sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES, pNext=sg
    )
    ssc = None
    head = drv
    if "VK_EXT_subgroup_size_control" in exts:
        ssc = vk.VkPhysicalDeviceSubgroupSizeControlProperties(
            sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_SIZE_CONTROL_PROPERTIES,
            pNext=drv,
        )
        head = ssc
    p2 = vk.VkPhysicalDeviceProperties2(
        sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, pNext=head
    )
    vk.vkGetPhysicalDeviceProperties2(physical, p2)
    return _MoreProperties(drv, sg, ssc)


@dataclass
class _Features:
    """What vkCreateDevice enables: a pNext chain of feature structs (each struct keeps the one
    it points to alive) and the device extensions."""

    chain: Any
    extensions: list[str]
    subgroup_control: bool
    full_subgroups: bool
    coopmat: coopmat.CoopmatSupport
    stats: bool


def _features(instance: Any, physical: Any, exts: set[str]) -> _Features:
    # Subgroup size control and full subgroups when the device has them.
    ssc_on = full_on = False
    feat_next = None
    dev_exts = []
    if "VK_EXT_subgroup_size_control" in exts:
        sscf = vk.VkPhysicalDeviceSubgroupSizeControlFeatures(
            sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_SIZE_CONTROL_FEATURES
        )
        f2 = vk.VkPhysicalDeviceFeatures2(
            sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, pNext=sscf
        )
        vk.vkGetPhysicalDeviceFeatures2(physical, f2)
        ssc_on, full_on = bool(sscf.subgroupSizeControl), bool(sscf.computeFullSubgroups)
        if ssc_on:
            feat_next = vk.VkPhysicalDeviceSubgroupSizeControlFeatures(
                sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_SIZE_CONTROL_FEATURES,
                subgroupSizeControl=vk.VK_TRUE,
                computeFullSubgroups=vk.VK_TRUE if full_on else vk.VK_FALSE,
            )
            dev_exts.append("VK_EXT_subgroup_size_control")

    # Cooperative matrices (tensor cores) for the coopmat prefill GEMM, where the device has them.
    cmat = coopmat.query(instance, physical, exts)
    if cmat.enabled:
        dev_exts.append(coopmat.EXTENSION)
    feat_next = coopmat.chain(cmat, feat_next)

    # Pipeline statistics (registers, spills per shader) for tools/vulkan_probe.py only:
    # FLEETTUNE_VK_STATS=1 enables VK_KHR_pipeline_executable_properties where offered.
    stats = bool(os.environ.get("FLEETTUNE_VK_STATS")) and STATS_EXTENSION in exts
    if stats:
        stats_feat = vk.VkPhysicalDevicePipelineExecutablePropertiesFeaturesKHR(
            sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PIPELINE_EXECUTABLE_PROPERTIES_FEATURES_KHR,
            pNext=feat_next,
            pipelineExecutableInfo=vk.VK_TRUE,
        )
        feat_next = stats_feat
        dev_exts.append(STATS_EXTENSION)
    return _Features(feat_next, dev_exts, ssc_on, full_on, cmat, stats)


def _compute_queue_family(families: Any, device_name: str) -> int:
    """A queue family with compute, preferring one that also has timestamps."""
    qf = None
    for i, f in enumerate(families):
        if f.queueFlags & vk.VK_QUEUE_COMPUTE_BIT and (qf is None or f.timestampValidBits):
            if qf is None or not families[qf].timestampValidBits:
                qf = i
    if qf is None:
        raise BackendUnavailable(f"{device_name}: no compute queue")
    return qf


def _device_info(
    physical: Any,
    props: Any,
    more: _MoreProperties,
    feats: _Features,
    mem: MemoryTypes,
    validation: bool,
    index: int,
) -> DeviceInfo:
    """The DeviceInfo a worker reports, its ``extra`` the limits and features the registry's
    constraints and the tools read."""
    drv, sg, ssc = more.driver, more.subgroup, more.size_control
    lim = props.limits
    name = props.deviceName if isinstance(props.deviceName, str) else ffi.string(props.deviceName)
    vendor = VENDORS.get(props.vendorID, hex(props.vendorID))
    memory_bytes = _local_heap_bytes(physical)
    driver_name = _cstr(drv.driverName)
    driver_info = _cstr(drv.driverInfo)
    drv_ver = driver_version_str(props.vendorID, props.driverVersion)
    extra = {
        "vendor_id": props.vendorID,
        "device_id": props.deviceID,
        "api_version": f"{props.apiVersion >> 22}.{(props.apiVersion >> 12) & 0x3FF}."
        f"{props.apiVersion & 0xFFF}",
        "driver_name": driver_name,
        "driver_info": driver_info,
        "max_storage_buffer_range": int(lim.maxStorageBufferRange),
        "max_shared_memory": int(lim.maxComputeSharedMemorySize),
        "max_workgroup_invocations": int(lim.maxComputeWorkGroupInvocations),
        "max_workgroup_size_x": int(lim.maxComputeWorkGroupSize[0]),
        "max_workgroup_count_x": int(lim.maxComputeWorkGroupCount[0]),
        "min_storage_buffer_offset_alignment": int(lim.minStorageBufferOffsetAlignment),
        "subgroup_operations": int(sg.supportedOperations),
        "subgroup_size_control": feats.subgroup_control,
        "compute_full_subgroups": feats.full_subgroups,
        "min_subgroup_size": int(ssc.minSubgroupSize) if ssc is not None else int(sg.subgroupSize),
        "max_subgroup_size": int(ssc.maxSubgroupSize) if ssc is not None else int(sg.subgroupSize),
        "max_compute_workgroup_subgroups": int(ssc.maxComputeWorkgroupSubgroups)
        if ssc is not None
        else 0,
        "subgroup_size_control_compute": bool(
            ssc is not None and ssc.requiredSubgroupSizeStages & vk.VK_SHADER_STAGE_COMPUTE_BIT
        ),
        "unified_memory": mem.unified,
        "memory_types": {"device": mem.device, "host": mem.host, "near": mem.near},
        "timestamp_period_ns": float(lim.timestampPeriod),
        "validation": validation,
        "index": index,  # of physical_devices(): the card this backend opened
        **feats.coopmat.extra(),
        "coopmat_missing": feats.coopmat.why,
        "pipeline_statistics": feats.stats,
    }
    return DeviceInfo(
        backend="vulkan",
        name=name,
        vendor=vendor,
        device_class=device_class(props.vendorID, name),
        driver=f"{driver_name} {driver_info}".strip() or drv_ver,
        memory_bytes=int(memory_bytes),
        subgroup_size=int(sg.subgroupSize),
        extra=extra | {"driver_version": drv_ver},
    )


def _cstr(x: Any) -> str:
    if isinstance(x, str):
        return x
    if isinstance(x, bytes):
        return x.decode("utf-8", "replace")
    try:
        return ffi.string(x).decode("utf-8", "replace")
    except TypeError:
        return str(x)
