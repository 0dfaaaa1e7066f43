// See query_terms.hpp. The steps and their order follow _scan /
// _next_token / _strip_possessive / _key / _slot_of / _lookup of
// index/analyzer_kernels.py and _query_term_weights; tests/test_analyzer_batch.py
// checks the two agree text by text.
#include "query_terms.hpp"

#include <atomic>
#include <cstring>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include "parallel.hpp"

namespace retriever {
namespace {

[[noreturn]] void fail(const std::string& msg) { throw std::invalid_argument(msg); }

constexpr uint8_t kWord = 1, kDigit = 2, kIdeo = 4;
constexpr uint64_t kFnvOffset = 0xCBF29CE484222325ull;
constexpr uint64_t kFnvPrime = 0x100000001B3ull;
constexpr uint64_t kMix = 0x9E3779B97F4A7C15ull;
/// Distinct terms of a query up to which duplicates are found by a linear scan.
constexpr size_t kLinearDedupe = 32;

/// Table key of token bytes b[0:m] (see _key): exact for m <= 7, else FNV-1a.
inline uint64_t token_key(const uint8_t* b, size_t m) {
    if (m <= 7) {
        uint64_t k = (0x80ull | m) << 56;
        for (size_t j = 0; j < m; ++j) k |= static_cast<uint64_t>(b[j]) << (8 * j);
        return k;
    }
    uint64_t h = kFnvOffset;
    for (size_t j = 0; j < m; ++j) h = (h ^ b[j]) * kFnvPrime;
    return (h >> 8) | (0xFFull << 56);
}

inline uint64_t slot_of(uint64_t key, uint64_t mask) {
    uint64_t x = key * kMix;
    x ^= x >> 29;
    x *= kMix;
    x ^= x >> 32;
    return x & mask;
}

class analyzer_worker {
  public:
    struct record {
        uint64_t start = 0;  // in the worker's buffers
        uint32_t count = 0;
        uint32_t worker = 0;
    };

    analyzer_worker(const uint8_t* data, const int64_t* offsets, const token_table_view& table,
                    const char_tables_view& chars, const float* idf, size_t n_terms, uint8_t* status,
                    record* records, uint32_t id, std::vector<uint32_t>& terms,
                    std::vector<float>& weights)
        : m_data(data), m_offsets(offsets), m_table(table), m_chars(chars), m_idf(idf),
          m_n_terms(n_terms), m_status(status), m_records(records), m_id(id), m_terms(terms),
          m_weights(weights), m_mask((table.n_slots >> 1) - 1) {}

    /// Analyses text q into m_qt / m_qc; false when it needs the caller.
    bool analyse_text(size_t q) {
        m_qt.clear();
        m_qc.clear();
        m_big = false;
        return analyse(static_cast<size_t>(m_offsets[q]), static_cast<size_t>(m_offsets[q + 1]));
    }

    /// Text q's terms and weights (see query_analyzer::analyse).
    bool analyse_into(size_t q, std::vector<uint32_t>& terms, std::vector<float>& weights) {
        terms.clear();
        weights.clear();
        if (!analyse_text(q)) return false;
        for (size_t j = 0; j < m_qt.size(); ++j) {
            const uint32_t t = m_qt[j];
            terms.push_back(t);
            weights.push_back(static_cast<float>(static_cast<double>(m_qc[j]) * static_cast<double>(m_idf[t])));
        }
        return true;
    }

    void operator()(size_t q) {
        const bool ok = analyse_text(q);
        record& r = m_records[q];
        r.worker = m_id;
        r.start = m_terms.size();
        if (!ok) {
            m_status[q] = 1;
            r.count = 0;
            return;
        }
        m_status[q] = 0;
        r.count = static_cast<uint32_t>(m_qt.size());
        for (size_t j = 0; j < m_qt.size(); ++j) {
            const uint32_t t = m_qt[j];
            m_terms.push_back(t);
            m_weights.push_back(static_cast<float>(static_cast<double>(m_qc[j]) * static_cast<double>(m_idf[t])));
        }
    }

  private:
    uint8_t flag(uint32_t c) const { return c < 0x10000 ? m_chars.flags[c] : 0; }

    /// False when the text needs the caller (non-BMP code point, unknown token).
    bool analyse(size_t i0, size_t end) {
        const size_t n = end - i0;
        if (m_lb.size() < n) m_lb.resize(2 * n);
        bool apos = false;
        size_t j = 0;
        {
            // locals: stores through a uint8_t* may alias any member, which would reload them per byte
            const uint8_t* src = m_data + i0;
            const uint8_t* fold = m_chars.ascii_fold;
            uint8_t* lb = m_lb.data();
            for (; j < n; ++j) {
                const uint8_t b = src[j];
                if (b >= 0x80) break;
                lb[j] = fold[b];
                apos |= (b == 0x27);
            }
        }
        if (j == n) {  // ASCII: tokenise the folded bytes in place
            size_t len = n;
            if (apos) len = strip_possessive(m_lb.data(), len);
            return tokens(m_lb.data(), len, [&](size_t s, size_t e) { return add(m_lb.data() + s, e - s); });
        }
        // general path: decode + fold, possessive strip, tokenise, encode each token
        if (m_cps.size() < 3 * n + 3) m_cps.resize(2 * (3 * n + 3));
        size_t len = 0;
        apos = false;
        size_t i = i0;
        while (i < end) {
            const uint32_t b = m_data[i];
            uint32_t cp;
            if (b < 0x80) {
                cp = b;
                i += 1;
            } else if (b < 0xE0) {
                if (i + 2 > end) return false;
                cp = ((b & 0x1F) << 6) | (m_data[i + 1] & 0x3F);
                i += 2;
            } else if (b < 0xF0) {
                if (i + 3 > end) return false;
                cp = ((b & 0x0F) << 12) | ((m_data[i + 1] & 0x3Fu) << 6) | (m_data[i + 2] & 0x3F);
                i += 3;
            } else {
                return false;  // above U+FFFF: the caller's Python path
            }
            if (m_chars.lowercase) {
                const uint32_t k = m_chars.fold_n[cp];
                for (uint32_t r = 0; r < k && r < 3; ++r) {
                    const uint32_t c2 = m_chars.fold_cp[3 * cp + r];
                    m_cps[len++] = c2;
                    apos |= (c2 == 0x27 || c2 == 0x2019);
                }
            } else {
                m_cps[len++] = cp;
                apos |= (cp == 0x27 || cp == 0x2019);
            }
        }
        if (apos) len = strip_possessive(m_cps.data(), len);
        return tokens(m_cps.data(), len, [&](size_t s, size_t e) {
            if (m_tokb.size() < 3 * (e - s)) m_tokb.resize(2 * 3 * (e - s));
            size_t m = 0;
            for (size_t p = s; p < e; ++p) m = put_utf8(m_tokb.data(), m, m_cps[p]);
            return add(m_tokb.data(), m);
        });
    }

    static size_t put_utf8(uint8_t* buf, size_t n, uint32_t cp) {
        if (cp < 0x80) {
            buf[n] = static_cast<uint8_t>(cp);
            return n + 1;
        }
        if (cp < 0x800) {
            buf[n] = static_cast<uint8_t>(0xC0 | (cp >> 6));
            buf[n + 1] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
            return n + 2;
        }
        buf[n] = static_cast<uint8_t>(0xE0 | ((cp >> 12) & 0x0F));
        buf[n + 1] = static_cast<uint8_t>(0x80 | ((cp >> 6) & 0x3F));
        buf[n + 2] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
        return n + 3;
    }

    /// Removes (?<=\w)['’][sS]\b in place, left to right, lookbehind on the
    /// unstripped text (as re.sub does); returns the new length.
    template <class T>
    size_t strip_possessive(T* buf, size_t n) const {
        size_t w = 0;
        for (size_t i = 0; i < n;) {
            const uint32_t c = buf[i];
            if ((c == 0x27 || c == 0x2019) && i > 0 && (flag(buf[i - 1]) & kWord) && i + 1 < n &&
                (buf[i + 1] == 0x73 || buf[i + 1] == 0x53) && (i + 2 >= n || !(flag(buf[i + 2]) & kWord))) {
                i += 2;
                continue;
            }
            buf[w++] = buf[i++];
        }
        return w;
    }

    /// Calls emit(start, end) for each token of buf[0:n] (see _next_token);
    /// stops and returns false as soon as emit does.
    template <class T, class Emit>
    bool tokens(const T* buf, size_t n, Emit&& emit) const {
        size_t i = 0;
        while (i < n) {
            const uint8_t f = flag(buf[i]);
            if (f & kIdeo) {
                if (!emit(i, i + 1)) return false;
                ++i;
                continue;
            }
            if (!(f & kWord)) {
                ++i;
                continue;
            }
            const size_t s = i++;
            for (;;) {
                while (i < n && (flag(buf[i]) & (kWord | kIdeo)) == kWord) ++i;
                if (i + 1 < n && (flag(buf[i + 1]) & (kWord | kIdeo)) == kWord) {
                    const uint32_t c = buf[i];
                    if (c == 0x2E || c == 0x27 || c == 0x2019) {
                        i += 2;
                        continue;
                    }
                    if (c == 0x2C && (flag(buf[i - 1]) & kDigit) && (flag(buf[i + 1]) & kDigit)) {
                        i += 2;
                        continue;
                    }
                }
                break;
            }
            if (!emit(s, i)) return false;
        }
        return true;
    }

    /// Looks the token up and counts its term; false when it is not in the table.
    bool add(const uint8_t* b, size_t m) {
        const uint64_t key = token_key(b, m);
        uint64_t slot = slot_of(key, m_mask);
        for (size_t probes = 0; probes <= m_mask; ++probes, slot = (slot + 1) & m_mask) {
            const uint64_t k2 = static_cast<uint64_t>(m_table.slots[2 * slot]);
            if (k2 == 0) return false;
            if (k2 != key) continue;
            const int64_t e = m_table.slots[2 * slot + 1];
            if (e < 0 || static_cast<uint64_t>(e) >= m_table.n_entries) {
                fail("token table: slot " + std::to_string(slot) + " holds entry " + std::to_string(e) +
                     " outside [0, " + std::to_string(m_table.n_entries) + ")");
            }
            if (m > 7) {
                const int64_t o = m_table.entry_off[e], o2 = m_table.entry_off[e + 1];
                if (o < 0 || o2 <= o || static_cast<uint64_t>(o2) > m_table.blob_len) {
                    fail("token table: entry " + std::to_string(e) + " has bytes [" + std::to_string(o) + ", " +
                         std::to_string(o2) + ") outside the blob of " + std::to_string(m_table.blob_len));
                }
                if (static_cast<size_t>(o2 - 1 - o) != m || std::memcmp(m_table.blob + o, b, m) != 0) continue;
            }
            count(m_table.value[e]);
            return true;
        }
        return false;
    }

    void count(int64_t v) {
        if (v < 0) return;  // stop word, over-long or not in the vocabulary
        if (static_cast<uint64_t>(v) >= m_n_terms) {
            fail("token table value " + std::to_string(v) + " >= n_terms = " + std::to_string(m_n_terms));
        }
        const uint32_t t = static_cast<uint32_t>(v);
        if (!m_big) {
            for (size_t j = 0; j < m_qt.size(); ++j) {
                if (m_qt[j] == t) {
                    ++m_qc[j];
                    return;
                }
            }
            m_qt.push_back(t);
            m_qc.push_back(1);
            if (m_qt.size() >= kLinearDedupe) {  // long query: a term -> position map from now on
                m_pos.clear();
                for (size_t j = 0; j < m_qt.size(); ++j) m_pos.emplace(m_qt[j], static_cast<uint32_t>(j));
                m_big = true;
            }
            return;
        }
        const auto hit = m_pos.emplace(t, static_cast<uint32_t>(m_qt.size()));
        if (!hit.second) {
            ++m_qc[hit.first->second];
            return;
        }
        m_qt.push_back(t);
        m_qc.push_back(1);
    }

    const uint8_t* m_data;
    const int64_t* m_offsets;
    const token_table_view& m_table;
    const char_tables_view& m_chars;
    const float* m_idf;
    size_t m_n_terms;
    uint8_t* m_status;
    record* m_records;
    uint32_t m_id;
    std::vector<uint32_t>& m_terms;
    std::vector<float>& m_weights;
    uint64_t m_mask;
    std::vector<uint8_t> m_lb;
    std::vector<uint32_t> m_cps;
    std::vector<uint8_t> m_tokb;
    std::vector<uint32_t> m_qt;  // the query's distinct terms, first-occurrence order
    std::vector<uint32_t> m_qc;  // their occurrences
    std::unordered_map<uint32_t, uint32_t> m_pos;  // term -> position in m_qt (long queries only)
    bool m_big = false;
};

}  // namespace

struct query_analyzer::impl {
    std::vector<uint32_t> unused_terms;
    std::vector<float> unused_weights;
    analyzer_worker worker;
    impl(const uint8_t* data, const int64_t* offsets, const token_table_view& table, const char_tables_view& chars,
         const float* idf, size_t n_terms)
        : worker(data, offsets, table, chars, idf, n_terms, nullptr, nullptr, 0, unused_terms, unused_weights) {}
};

query_analyzer::query_analyzer(const uint8_t* data, const int64_t* offsets, const token_table_view& table,
                               const char_tables_view& chars, const float* idf, size_t n_terms)
    : m_impl(std::make_unique<impl>(data, offsets, table, chars, idf, n_terms)) {}
query_analyzer::~query_analyzer() = default;
query_analyzer::query_analyzer(query_analyzer&&) noexcept = default;

bool query_analyzer::analyse(size_t i, std::vector<uint32_t>& terms, std::vector<float>& weights) {
    return m_impl->worker.analyse_into(i, terms, weights);
}

void check_query_texts(size_t data_len, const int64_t* offsets, size_t n, const token_table_view& table) {
    if (offsets[0] < 0) fail("offsets[0] = " + std::to_string(offsets[0]) + " < 0");
    for (size_t i = 0; i < n; ++i) {
        if (offsets[i + 1] < offsets[i] || static_cast<uint64_t>(offsets[i + 1]) > data_len) {
            fail("offsets[" + std::to_string(i + 1) + "] = " + std::to_string(offsets[i + 1]) +
                 " is below offsets[" + std::to_string(i) + "] or past the data (" + std::to_string(data_len) +
                 " bytes)");
        }
    }
    const size_t cap = table.n_slots >> 1;
    if (table.n_slots < 2 || (table.n_slots & 1) || (cap & (cap - 1)) != 0) {
        fail("token table slots must hold 2 * cap values with cap a power of two, got " +
             std::to_string(table.n_slots));
    }
    if (table.n_off < table.n_entries + 1) {
        fail("token table offsets hold " + std::to_string(table.n_off) + " values for " +
             std::to_string(table.n_entries) + " entries");
    }
}

void bm25_query_terms(const uint8_t* data, size_t data_len, const int64_t* offsets, size_t n,
                      const token_table_view& table, const char_tables_view& chars, const float* idf,
                      size_t n_terms, int n_threads, uint64_t* q_offsets, uint8_t* status,
                      std::vector<uint32_t>& q_terms, std::vector<float>& q_weights) {
    check_query_texts(data_len, offsets, n, table);
    const size_t n_workers = resolve_threads(n_threads, n);
    std::vector<analyzer_worker::record> records(n);
    std::vector<std::vector<uint32_t>> terms(n_workers);
    std::vector<std::vector<float>> weights(n_workers);
    std::atomic<uint32_t> next_id{0};
    parallel_for_items(n, static_cast<int>(n_workers), 8, [&]() {
        const uint32_t id = next_id.fetch_add(1);
        return analyzer_worker(data, offsets, table, chars, idf, n_terms, status, records.data(), id,
                               terms[id], weights[id]);
    });
    q_offsets[0] = 0;
    for (size_t i = 0; i < n; ++i) q_offsets[i + 1] = q_offsets[i] + records[i].count;
    q_terms.resize(q_offsets[n]);
    q_weights.resize(q_offsets[n]);
    for (size_t i = 0; i < n; ++i) {
        const auto& r = records[i];
        if (r.count == 0) continue;
        std::memcpy(q_terms.data() + q_offsets[i], terms[r.worker].data() + r.start, r.count * sizeof(uint32_t));
        std::memcpy(q_weights.data() + q_offsets[i], weights[r.worker].data() + r.start, r.count * sizeof(float));
    }
}

}  // namespace retriever
