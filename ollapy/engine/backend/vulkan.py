"""Mesa's software Vulkan device (lavapipe): visible to ggml, but used only when asked for.

ggml's Vulkan backend (``ggml-vulkan.cpp``, ``ggml_vk_instance_init``) takes discrete and integrated GPUs, else
the first device that is not of type CPU, and skips CPU-type devices altogether: on a machine whose only Vulkan
device is lavapipe it finds none ("No devices found"). Unless ``GGML_VK_VISIBLE_DEVICES`` is set, which it reads
once, at its first device enumeration.

:func:`expose_software_device` runs before llama.cpp's library is loaded (:mod:`.bindings` calls it first). Only
for a build with the Vulkan backend (a ``ggml-vulkan`` library next to llama-cpp-python's) and only when the
variable is unset, it lists the Vulkan physical devices itself through the loader (``libvulkan.so.1``:
``vkCreateInstance``, ``vkEnumeratePhysicalDevices``, ``vkGetPhysicalDeviceProperties``; no ``vulkaninfo``, a few
ms) and applies ggml's rule: when every device is of type CPU, it sets ``GGML_VK_VISIBLE_DEVICES`` to the first
one's index and records why (:data:`NOTE`, shown by ``ollapy info`` and logged at debug level). A set variable,
even an empty one (``GGML_VK_VISIBLE_DEVICES=`` hides every Vulkan device), is left as it is, unless the ollapy
process that started this one set it (a runner child inherits it with ``OLLAPY_VK_SOFTWARE_DEVICE`` beside it).

The device made visible that way is opt-in (:func:`software_only`): lavapipe decodes far slower than
llama.cpp's CPU backend, so a model gets no device at all (every layer on the CPU, no prompt products offloaded)
unless ``num_gpu`` asks for layers (``-o num_gpu=N``, N > 0), and ``ollapy info`` says ``gpu offload: no`` and
why. A user who sets ``GGML_VK_VISIBLE_DEVICES`` (e.g. ``=0``) chooses the device: it is then a GPU like any
other, offloaded by default.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import importlib.util
import logging
import os
from pathlib import Path

log = logging.getLogger("ollapy.engine")

ENV = "GGML_VK_VISIBLE_DEVICES"
DEVICE_TYPES = {0: "other", 1: "integrated gpu", 2: "discrete gpu", 3: "virtual gpu", 4: "cpu"}  # VkPhysicalDeviceType
_PROPS_BYTES = 4096  # VkPhysicalDeviceProperties is 824 bytes in Vulkan 1.x; deviceType at 16, deviceName at 20

MARK = "OLLAPY_VK_SOFTWARE_DEVICE"  # ollapy's own value of ENV, so that a child process tells it from a user's

NOTE: str | None = None
"""One line saying that this process made a software Vulkan device visible, or None when it did not."""


class _InstanceCreateInfo(ctypes.Structure):
    _fields_ = [("sType", ctypes.c_int), ("pNext", ctypes.c_void_p), ("flags", ctypes.c_uint32),
                ("pApplicationInfo", ctypes.c_void_p), ("enabledLayerCount", ctypes.c_uint32),
                ("ppEnabledLayerNames", ctypes.c_void_p), ("enabledExtensionCount", ctypes.c_uint32),
                ("ppEnabledExtensionNames", ctypes.c_void_p)]


def build_has_vulkan() -> bool:
    """True when the installed llama-cpp-python carries ggml's Vulkan backend library (a file check; no import)."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        return False
    lib_dir = Path(next(iter(spec.submodule_search_locations))) / "lib"
    return any(lib_dir.glob("*ggml-vulkan*"))


def physical_devices() -> list[tuple[str, str]]:
    """``[(name, type), ...]`` of the Vulkan physical devices the loader finds, in its order (the indices
    ``GGML_VK_VISIBLE_DEVICES`` uses); type as in :data:`DEVICE_TYPES`. Empty when there is no Vulkan loader or
    instance."""
    path = ctypes.util.find_library("vulkan") or "libvulkan.so.1"
    try:
        vk = ctypes.CDLL(path)
    except OSError:
        return []
    vk.vkCreateInstance.restype = ctypes.c_int
    vk.vkCreateInstance.argtypes = [ctypes.POINTER(_InstanceCreateInfo), ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]
    vk.vkEnumeratePhysicalDevices.restype = ctypes.c_int
    vk.vkEnumeratePhysicalDevices.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint32), ctypes.c_void_p]
    vk.vkGetPhysicalDeviceProperties.restype = None
    vk.vkGetPhysicalDeviceProperties.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    vk.vkDestroyInstance.restype = None
    vk.vkDestroyInstance.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    info = _InstanceCreateInfo(sType=1)  # VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO; no layers, no extensions
    instance = ctypes.c_void_p()
    if vk.vkCreateInstance(ctypes.byref(info), None, ctypes.byref(instance)) != 0:
        return []
    try:
        count = ctypes.c_uint32(0)
        if vk.vkEnumeratePhysicalDevices(instance, ctypes.byref(count), None) != 0 or count.value == 0:
            return []
        handles = (ctypes.c_void_p * count.value)()
        if vk.vkEnumeratePhysicalDevices(instance, ctypes.byref(count), handles) not in (0, 5):  # VK_INCOMPLETE = 5
            return []
        out = []
        for handle in handles[:count.value]:
            props = ctypes.create_string_buffer(_PROPS_BYTES)
            vk.vkGetPhysicalDeviceProperties(handle, props)
            kind = int.from_bytes(props.raw[16:20], "little")
            name = props.raw[20:276].split(b"\0", 1)[0].decode("utf-8", "replace")
            out.append((name, DEVICE_TYPES.get(kind, "other")))
        return out
    finally:
        vk.vkDestroyInstance(instance, None)


def software_device() -> tuple[int, str] | None:
    """``(index, name)`` of the Vulkan device ggml would need ``GGML_VK_VISIBLE_DEVICES`` for: the first one,
    when every Vulkan device the loader finds is of type CPU (lavapipe); None when there is none or a real GPU."""
    devs = physical_devices()
    if not devs or any(kind != "cpu" for _, kind in devs):
        return None
    return 0, devs[0][0]


def expose_software_device() -> str | None:
    """Set ``GGML_VK_VISIBLE_DEVICES`` when this is a Vulkan build, the variable is unset, and every Vulkan
    device is CPU-type (see the module docstring). Returns (and keeps in :data:`NOTE`) the line saying so, or
    None. Call it before llama.cpp's library is loaded; idempotent."""
    global NOTE
    if NOTE is not None:
        return NOTE
    if ENV in os.environ and os.environ.get(MARK) == os.environ[ENV]:
        del os.environ[ENV]  # set by the ollapy process that started this one (a runner child), not by the user
    os.environ.pop(MARK, None)
    if ENV in os.environ or not build_has_vulkan():
        return None
    found = software_device()
    if found is None:
        return None
    os.environ[ENV] = os.environ[MARK] = str(found[0])
    NOTE = (f"{ENV}={found[0]} set by ollapy: the only Vulkan device is the software device {found[1]!r} (type CPU), slower "
            f"than the CPU backend, so models keep every layer on the CPU unless -o num_gpu=N (N > 0) asks for it; "
            f"{ENV}={found[0]} in the environment makes it the default device, {ENV}= (empty) hides it")
    log.debug("%s", NOTE)
    return NOTE


def software_only() -> bool:
    """True when this process made a software Vulkan device visible (:func:`expose_software_device`): the only
    GPUs ggml lists are CPU-type Vulkan devices the user did not ask for, which a model uses only when its
    ``num_gpu`` asks for layers (> 0)."""
    return NOTE is not None
