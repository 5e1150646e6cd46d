#include "wire.h"

#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "core/bootstrap/address.h"
#include "core/bootstrap/handshake.h"
#include "core/common/sha256.h"

namespace py = pybind11;

namespace weft::python {
namespace {

py::bytes digest_bytes(const Digest& d) {
  return py::bytes(reinterpret_cast<const char*>(d.data()), d.size());
}

}  // namespace

void bind_wire(py::module_& parent) {
  py::module_ m = parent.def_submodule(
      "wire", "The bootstrap's parsers of foreign bytes, and its SHA-256 and HMAC-SHA256.");
  m.def(
      "sha256",
      [](const py::bytes& data) {
        std::string s = data;
        return digest_bytes(sha256(s.data(), s.size()));
      },
      py::arg("data"));
  m.def(
      "hmac_sha256",
      [](const py::bytes& key, const py::bytes& data) {
        std::string k = key, s = data;
        return digest_bytes(hmac_sha256(k.data(), k.size(), s.data(), s.size()));
      },
      py::arg("key"), py::arg("data"));
  m.def(
      "decode_hello",
      [](const py::bytes& data) -> py::object {
        std::string s = data;
        auto h = decode_hello(reinterpret_cast<const uint8_t*>(s.data()), s.size());
        if (!h) return py::none();
        return py::make_tuple(h->from, h->to, h->index);
      },
      py::arg("data"), "(from, to, index) of a bootstrap hello, or None.");
  m.def(
      "decode_challenge",
      [](const py::bytes& data) {
        std::string s = data;
        return decode_challenge(reinterpret_cast<const uint8_t*>(s.data()), s.size()).has_value();
      },
      py::arg("data"), "Whether the bytes are a bootstrap challenge.");
  m.def(
      "decode_address",
      [](const py::bytes& data) -> py::object {
        std::string s = data;
        auto a = decode_address(std::vector<uint8_t>(s.begin(), s.end()));
        if (!a) return py::none();
        return py::make_tuple(a->size, a->pid, a->port, a->host_id, a->ip);
      },
      py::arg("data"), "(size, pid, port, host_id, ip) of a Store address entry, or None.");
}

}  // namespace weft::python
