// The rendezvous store client: Gloo's Store interface over the launcher's TCP key-value server
// (runtime/store.ts states the protocol), and a prefixed view for one communicator's keys.
//
// The protocol, little-endian: a request is a command byte, a u32 count of strings and the strings
// (u32 length, bytes); a reply is a u32 length and its bytes.
//   set  [key, value]  → ""            add   [key, i64 delta] → i64 (the new value)
//   get  [key]         → 1 + value, or 0 when the key is absent
//   wait [key, …]      → 1 once every key is set (the server holds the reply until then)
//   hello [name]       → ""            names the connection: a rank's is its rank, in decimal
// One request at a time per connection; the client holds a lock around each.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <gloo/rendezvous/store.h>

namespace lfc::comm {

class TcpStore : public gloo::rendezvous::Store {
 public:
  // Connects to host:port, retrying until `timeout` (the server may start after this rank).
  TcpStore(const std::string& host, int port, std::chrono::milliseconds timeout);
  ~TcpStore() override;

  void set(const std::string& key, const std::vector<char>& data) override;
  // waits for the key (up to the timeout), then returns its value
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;
  int64_t add(const std::string& key, int64_t delta);
  // Names this connection to the server: a store hosted by a rank stays up after that rank's
  // failure until the other ranks' connections close (runtime/rank.ts)
  void hello(const std::string& name);
  std::optional<std::vector<char>> tryGet(const std::string& key) { return tryGet(key, timeout_); }
  std::optional<std::vector<char>> tryGet(const std::string& key, std::chrono::milliseconds timeout);

 private:
  std::vector<char> request(uint8_t cmd, const std::vector<std::string>& parts,
                            std::chrono::milliseconds timeout);

  std::string where_;
  int fd_ = -1;
  std::chrono::milliseconds timeout_;
  std::mutex mu_;
};

// Keys of `store` under "prefix/", with waits that honour the given timeout (Gloo's own
// PrefixStore falls back to a fixed 30 s).
class PrefixedStore : public gloo::rendezvous::Store {
 public:
  PrefixedStore(std::string prefix, gloo::rendezvous::Store& store, std::chrono::milliseconds timeout)
      : prefix_(std::move(prefix)), store_(store), timeout_(timeout) {}
  void set(const std::string& key, const std::vector<char>& data) override { store_.set(key_(key), data); }
  std::vector<char> get(const std::string& key) override {
    store_.wait({key_(key)}, timeout_);
    return store_.get(key_(key));
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    std::vector<std::string> full;
    for (const auto& k : keys) full.push_back(key_(k));
    store_.wait(full, timeout);
  }

 private:
  std::string key_(const std::string& k) const { return prefix_ + "/" + k; }
  std::string prefix_;
  gloo::rendezvous::Store& store_;
  std::chrono::milliseconds timeout_;
};

}  // namespace lfc::comm
