#include "coordinator/store/etcd_store.h"

#include <algorithm>
#include <iterator>
#include <map>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace pipetrain {
namespace {

using KeyValues = std::vector<std::pair<std::string, std::string>>;

// Store keys live under "<prefix>kv/"; the election's key and the write
// sequence beside them.
constexpr char kDataDir[] = "kv/";
constexpr char kSequenceKey[] = "seq";
// A Commit whose Txn fails on the sequence key is sent this many times in
// all, the key read again in between.
constexpr int kSequenceAttempts = 2;
// Scan starts again from scratch this often when etcd compacts the revision
// it reads at; compaction keeps at least the last few minutes, so more
// means something is wrong.
constexpr int kScanAttempts = 3;

// A half-open range [begin, end) of etcd keys.
using KeyRange = std::pair<std::string, std::string>;

// The net effect of a batch: ranges to delete, none holding a key to put.
struct NetEffect {
  std::vector<KeyRange> deletes;
  std::map<std::string, std::string> puts;
};

// The ranges merged where they overlap or touch, ascending.
std::vector<KeyRange> Merge(std::vector<KeyRange> ranges) {
  std::sort(ranges.begin(), ranges.end());
  std::vector<KeyRange> merged;
  for (KeyRange& r : ranges) {
    if (!merged.empty() && r.first <= merged.back().second) {
      merged.back().second = std::max(merged.back().second, r.second);
    } else {
      merged.push_back(std::move(r));
    }
  }
  return merged;
}

// Replays `writes` (etcd keys already) in order: a put after a delete wins
// over it and a delete after a put removes it. Then cuts each put key out
// of the deleted ranges, since etcd refuses a Txn whose put and delete meet.
NetEffect Net(const std::vector<StoreWrite>& writes) {
  NetEffect net;
  std::vector<KeyRange> deleted;
  for (const StoreWrite& w : writes) {
    switch (w.kind) {
      case StoreWrite::Kind::kPut:
        net.puts[w.key] = w.value;
        break;
      case StoreWrite::Kind::kDelete:
        net.puts.erase(w.key);
        deleted.emplace_back(w.key, w.key + '\0');  // Exactly {key}.
        break;
      case StoreWrite::Kind::kDeletePrefix: {
        const std::string end = EtcdPrefixEnd(w.key);
        net.puts.erase(net.puts.lower_bound(w.key), net.puts.lower_bound(end));
        deleted.emplace_back(w.key, end);
        break;
      }
    }
  }
  for (const KeyRange& r : Merge(std::move(deleted))) {
    std::string from = r.first;
    for (auto it = net.puts.lower_bound(r.first); it != net.puts.end() && it->first < r.second;
         ++it) {
      if (from < it->first) net.deletes.emplace_back(from, it->first);
      from = it->first + '\0';
    }
    if (from < r.second) net.deletes.emplace_back(from, r.second);
  }
  return net;
}

void AddOps(const NetEffect& net, etcdserverpb::TxnRequest* txn) {
  for (const KeyRange& r : net.deletes) {
    etcdserverpb::DeleteRangeRequest* del = txn->add_success()->mutable_request_delete_range();
    del->set_key(r.first);
    if (r.second != r.first + '\0') del->set_range_end(r.second);  // Else the single key.
  }
  for (const auto& [key, value] : net.puts) {
    etcdserverpb::PutRequest* put = txn->add_success()->mutable_request_put();
    put->set_key(key);
    put->set_value(value);
  }
}

// The fence: the leader key still holds `term`'s creation. On failure the
// Txn reads the key instead, to name the leader.
void AddFence(const LeaderTerm& term, etcdserverpb::TxnRequest* txn) {
  etcdserverpb::Compare* same = txn->add_compare();
  same->set_key(term.key);
  same->set_target(etcdserverpb::Compare::CREATE);
  same->set_result(etcdserverpb::Compare::EQUAL);
  same->set_create_revision(term.create_revision);
  txn->add_failure()->mutable_request_range()->set_key(term.key);
}

// The write sequence: the key still has the mod_revision `revision` (0:
// absent), and the Txn puts it. On failure the Txn reads the key, as the
// new revision to expect.
void AddSequence(const std::string& key, int64_t revision, etcdserverpb::TxnRequest* txn) {
  etcdserverpb::Compare* same = txn->add_compare();
  same->set_key(key);
  same->set_target(etcdserverpb::Compare::MOD);
  same->set_result(etcdserverpb::Compare::EQUAL);
  same->set_mod_revision(revision);
  txn->add_success()->mutable_request_put()->set_key(key);
  txn->add_failure()->mutable_request_range()->set_key(key);
}

// What a failed Txn's failure branch read of the key of compare `i` (each
// compare adds one Range, in order); null where the key is absent.
const mvccpb::KeyValue* ReadBack(const etcdserverpb::TxnResponse& response, int i) {
  if (i >= response.responses_size()) return nullptr;
  const etcdserverpb::RangeResponse& range = response.responses(i).response_range();
  return range.kvs_size() > 0 ? &range.kvs(0) : nullptr;
}

absl::Status NotLeader(const std::string& leader, const std::string& why) {
  return absl::FailedPreconditionError(absl::StrCat(
      "not the leader (",
      leader.empty() ? "no leader is elected now; retry once one is" : "leader is " + leader,
      "): ", why));
}

// OK where a failed Txn's leader fence on `term` held (the failure branch
// read the leader key first), so another compare failed; else the error
// naming the leader now.
absl::Status FenceHeld(const LeaderTerm& term, const etcdserverpb::TxnResponse& response) {
  const mvccpb::KeyValue* held = ReadBack(response, 0);
  if (held != nullptr && held->create_revision() == term.create_revision) {
    return absl::OkStatus();
  }
  // Filtered as the election filters it: whoever may write the key may put
  // anything there, and this goes into logs and callers' errors.
  return NotLeader(held == nullptr ? "" : LeaderIdentityOf(held->value()),
                   absl::StrCat("the term of ", term.identity, " (leader key ", term.key,
                                " created at revision ", term.create_revision, ") has ended"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<EtcdStore>> EtcdStore::Open(EtcdOptions options,
                                                           const LeadershipView* leadership) {
  ASSIGN_OR_RETURN(std::unique_ptr<EtcdClient> client, EtcdClient::Create(std::move(options)));
  std::unique_ptr<EtcdStore> store(new EtcdStore(std::move(client), leadership));
  etcdserverpb::RangeRequest probe;
  probe.set_key(store->data_prefix_);
  probe.set_range_end(EtcdPrefixEnd(store->data_prefix_));
  probe.set_count_only(true);
  etcdserverpb::RangeResponse response;
  RETURN_IF_ERROR(store->client_->Range(probe, &response));
  return store;
}

EtcdStore::EtcdStore(std::unique_ptr<EtcdClient> client, const LeadershipView* leadership)
    : client_(std::move(client)),
      leadership_(leadership),
      data_prefix_(client_->options().prefix + kDataDir),
      seq_key_(client_->options().prefix + kSequenceKey) {}

absl::Status EtcdStore::Commit(const std::vector<StoreWrite>& writes) {
  RETURN_IF_ERROR(CheckStoreWrites(writes));
  if (writes.empty() && leadership_ == nullptr) return absl::OkStatus();
  ASSIGN_OR_RETURN(const std::optional<LeaderTerm> term, FencingTerm());
  const int seq = term.has_value() ? 1 : 0;  // the index of the sequence's compare
  AnnotatedMutexLock lock(&commit_mu_);
  for (int attempt = 1;; ++attempt) {
    ASSIGN_OR_RETURN(const etcdserverpb::TxnRequest txn, BuildTxn(writes, term));
    const bool sequenced = txn.compare_size() > seq;
    etcdserverpb::TxnResponse response;
    absl::Status sent = client_->Txn(txn, &response);
    if (!sent.ok()) {
      seq_revision_.reset();  // It may have been applied, now or later.
      return sent;
    }
    if (response.succeeded()) {
      if (sequenced) seq_revision_ = response.header().revision();  // It put the key.
      MaybeCompact(response.header().revision(), static_cast<int64_t>(txn.ByteSizeLong()));
      return absl::OkStatus();
    }
    if (term.has_value()) RETURN_IF_ERROR(FenceHeld(*term, response));
    if (!sequenced) return absl::InternalError("etcd failed a Txn whose leader fence holds");
    // Another write came first: a Commit of this store's that timed out and
    // was applied since, or another store's (no LeadershipView). This batch
    // is still the latest intent, so it goes again, fenced on the new key.
    const mvccpb::KeyValue* now = ReadBack(response, seq);
    seq_revision_ = now == nullptr ? 0 : now->mod_revision();
    if (attempt == kSequenceAttempts) {
      return absl::UnavailableError(absl::StrCat(
          "etcd Commit to ", Describe(), ": another write came first ", kSequenceAttempts,
          " times (the write sequence key ", seq_key_,
          " changed), so nothing was applied; another store writes this prefix (give the "
          "coordinators a leader election, or each a prefix of its own); retry"));
    }
  }
}

absl::StatusOr<etcdserverpb::TxnRequest> EtcdStore::BuildTxnForTesting(
    const std::vector<StoreWrite>& writes) {
  RETURN_IF_ERROR(CheckStoreWrites(writes));
  ASSIGN_OR_RETURN(const std::optional<LeaderTerm> term, FencingTerm());
  AnnotatedMutexLock lock(&commit_mu_);
  return BuildTxn(writes, term);
}

absl::StatusOr<std::optional<LeaderTerm>> EtcdStore::FencingTerm() const {
  if (leadership_ == nullptr) return std::optional<LeaderTerm>();
  std::optional<LeaderTerm> term = leadership_->CurrentTerm();
  if (!term.has_value()) {
    return NotLeader(leadership_->Leader(), "this coordinator lost the election");
  }
  return term;
}

absl::StatusOr<etcdserverpb::TxnRequest> EtcdStore::BuildTxn(
    const std::vector<StoreWrite>& writes, const std::optional<LeaderTerm>& term) {
  std::vector<StoreWrite> scoped = writes;
  for (StoreWrite& w : scoped) w.key = DataKey(w.key);
  etcdserverpb::TxnRequest txn;
  AddOps(Net(scoped), &txn);
  const bool sequenced = txn.success_size() > 0;  // Else nothing to apply late.
  const EtcdOptions& options = client_->options();
  const int ops = txn.success_size() + (sequenced ? 1 : 0);
  if (ops > options.max_txn_ops) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch of ", writes.size(), " writes needs ", ops,
        " etcd operations (one is the store's write sequence); the limit is ", options.max_txn_ops,
        " (etcd --max-txn-ops); split the batch, or raise the limit in etcd and in EtcdOptions"));
  }
  if (term.has_value()) AddFence(*term, &txn);  // First: its Range is the failure's first.
  if (sequenced) {
    if (!seq_revision_.has_value()) RETURN_IF_ERROR(ReadSequence());
    AddSequence(seq_key_, *seq_revision_, &txn);
  }
  const size_t bytes = txn.ByteSizeLong();
  if (bytes > options.max_request_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch of ", writes.size(), " writes is ", bytes, " bytes as an etcd Txn; the limit is ",
        options.max_request_bytes,
        " (etcd --max-request-bytes); split the batch, or raise the limit in etcd and in "
        "EtcdOptions"));
  }
  return txn;
}

absl::Status EtcdStore::ReadSequence() {
  etcdserverpb::RangeRequest request;
  request.set_key(seq_key_);
  etcdserverpb::RangeResponse response;
  RETURN_IF_ERROR(client_->Range(request, &response));
  seq_revision_ = response.kvs_size() == 0 ? 0 : response.kvs(0).mod_revision();
  return absl::OkStatus();
}

void EtcdStore::MaybeCompact(int64_t revision, int64_t bytes) {
  const EtcdOptions& options = client_->options();
  recent_.emplace_back(revision, bytes);
  while (static_cast<int64_t>(recent_.size()) > options.kept_revisions) recent_.pop_front();
  const bool commits_up = (commits_.fetch_add(1) + 1) % options.compaction_interval_commits == 0;
  const bool bytes_up =
      bytes_since_compaction_.fetch_add(bytes) + bytes >= options.compaction_interval_bytes;
  if (!commits_up && !bytes_up) return;
  bytes_since_compaction_.store(0);  // the next interval counts from this try
  // kept_revisions revisions back, or nearer: the oldest of this store's
  // latest Commits that together carry at most compaction_interval_bytes
  // (the newest whatever its size).
  int64_t target = revision - options.kept_revisions;
  int64_t kept_bytes = 0;
  for (auto it = recent_.rbegin(); it != recent_.rend(); ++it) {
    kept_bytes += it->second;
    if (it != recent_.rbegin() && kept_bytes > options.compaction_interval_bytes) {
      target = std::max(target, std::prev(it)->first);  // the oldest that fits
      break;
    }
  }
  if (target <= compacted_to_.load()) return;
  etcdserverpb::CompactionRequest request;
  request.set_revision(target);
  // Not physical: etcd reclaims the space in the background, and this
  // Commit's caller does not wait for it.
  absl::Status compacted = client_->Compact(request, absl::Now() + options.rpc_timeout);
  // OUT_OF_RANGE: compacted to there or beyond already (etcd's own
  // auto-compaction, or another coordinator before this one led).
  if (compacted.ok() || compacted.code() == absl::StatusCode::kOutOfRange) {
    int64_t seen = compacted_to_.load();
    while (seen < target && !compacted_to_.compare_exchange_weak(seen, target)) {
    }
    return;
  }
  PT_LOG(WARNING) << "etcd compaction up to revision " << target << " failed (tried again after "
                  << options.compaction_interval_commits << " more commits or "
                  << options.compaction_interval_bytes << " more bytes): " << compacted;
}

absl::StatusOr<std::optional<std::string>> EtcdStore::Get(const std::string& key) const {
  RETURN_IF_ERROR(CheckStoreKey(key));
  etcdserverpb::RangeRequest request;
  request.set_key(DataKey(key));
  etcdserverpb::RangeResponse response;
  RETURN_IF_ERROR(client_->Range(request, &response));
  if (response.kvs_size() == 0) return std::optional<std::string>();
  RETURN_IF_ERROR(CheckStoredEntry(Describe(), key, response.kvs(0).value().size()));
  return std::optional<std::string>(response.kvs(0).value());
}

absl::StatusOr<KeyValues> EtcdStore::Scan(const std::string& prefix) const {
  if (!prefix.empty()) RETURN_IF_ERROR(CheckStoreKey(prefix));
  const std::string begin = DataKey(prefix);
  const std::string end = EtcdPrefixEnd(begin);
  absl::StatusOr<KeyValues> found;
  for (int attempt = 0; attempt < kScanAttempts; ++attempt) {
    found = ScanOnce(begin, end);
    if (!absl::IsOutOfRange(found.status())) return found;
  }
  return absl::UnavailableError(absl::StrCat("scan of ", prefix, " in ", Describe(),
                                             ": etcd compacted the revision read ", kScanAttempts,
                                             " times (", found.status().message(), "); retry"));
}

absl::StatusOr<KeyValues> EtcdStore::ScanOnce(const std::string& begin,
                                              const std::string& end) const {
  KeyValues found;
  etcdserverpb::RangeRequest request;
  request.set_key(begin);
  request.set_range_end(end);
  request.set_limit(client_->options().scan_page_keys);
  const std::string where = Describe();
  for (;;) {
    etcdserverpb::RangeResponse response;
    absl::Status status = client_->Range(request, &response);
    if (absl::IsResourceExhausted(status) && request.limit() > 1) {
      request.set_limit(request.limit() / 2);  // Large values: smaller pages.
      continue;
    }
    if (absl::IsResourceExhausted(status)) return absl::InternalError(status.message());
    RETURN_IF_ERROR(status);
    // Every later page at the first one's revision: one snapshot.
    if (request.revision() == 0) request.set_revision(response.header().revision());
    for (const mvccpb::KeyValue& kv : response.kvs()) {
      const absl::string_view key = absl::string_view(kv.key()).substr(data_prefix_.size());
      RETURN_IF_ERROR(CheckStoredEntry(where, key, kv.value().size()));
      found.emplace_back(std::string(key), kv.value());
    }
    if (!response.more() || response.kvs_size() == 0) return found;
    request.set_key(response.kvs(response.kvs_size() - 1).key() + '\0');
  }
}

std::string EtcdStore::Describe() const {
  return absl::StrCat(client_->Describe(), " prefix ", client_->options().prefix);
}

}  // namespace pipetrain
