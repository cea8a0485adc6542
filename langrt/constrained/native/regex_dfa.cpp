// A regex as a deterministic automaton over UTF-8 bytes: parse, Thompson NFA, subset construction
// over byte classes, dead ends cut. The regex is matched whole (anchored at both ends).
//
// Only the syntax the grammar compilers write is read here (regex.py's subset of Rust's regex
// syntax: groups, alternation, classes, `* + ? {m,n}`, `.`, escapes of metacharacters and of
// code points); anything else (`\d`, `\p{..}`, anchors, flags, nested classes) is reported as
// unsupported and byte_dfa.py builds that regex with outlines-core instead, so the language
// read here is exactly the one outlines-core reads. Plain C++, any CPU; regex_dfa.py builds it.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

enum Status : int64_t { OK = 0, UNSUPPORTED = 1, TOO_BIG = 2 };

struct Range {
    uint32_t lo, hi;
};

// ---------------------------------------------------------------------------------------------
// Syntax tree

enum Kind { EMPTY, SET, CAT, ALT, REP };

struct Node {
    explicit Node(Kind k) : kind(k) {}
    Kind kind;
    std::vector<Range> set;  // SET: sorted, disjoint code point ranges (surrogates left out)
    std::vector<int> kids;   // CAT, ALT; REP: one
    int lo = 0, hi = 0;      // REP: hi < 0 means no upper bound
};

constexpr uint32_t MAX_CP = 0x10FFFF;
constexpr int MAX_COUNT = 1000;  // a bigger {m,n} goes to outlines-core

std::vector<Range> normalize(std::vector<Range> r) {
    std::sort(r.begin(), r.end(), [](Range a, Range b) { return a.lo < b.lo; });
    std::vector<Range> out;
    for (Range x : r) {
        if (!out.empty() && x.lo <= out.back().hi + 1) {
            out.back().hi = std::max(out.back().hi, x.hi);
        } else {
            out.push_back(x);
        }
    }
    // Unicode scalar values only: a class never holds a surrogate (as in Rust's regex)
    std::vector<Range> cut;
    for (Range x : out) {
        if (x.hi < 0xD800 || x.lo > 0xDFFF) {
            cut.push_back(x);
            continue;
        }
        if (x.lo < 0xD800) cut.push_back({x.lo, 0xD7FF});
        if (x.hi > 0xDFFF) cut.push_back({0xE000, x.hi});
    }
    return cut;
}

std::vector<Range> complement(const std::vector<Range>& r) {
    std::vector<Range> out;
    uint32_t next = 0;
    for (Range x : r) {
        if (x.lo > next) out.push_back({next, x.lo - 1});
        next = x.hi + 1;
    }
    if (next <= MAX_CP) out.push_back({next, MAX_CP});
    return normalize(out);
}

struct Unsupported {};

class Parser {
  public:
    Parser(const uint8_t* text, size_t size) : s_(text), n_(size) {}

    std::vector<Node> nodes;

    int parse() {
        int root = alternation();
        if (i_ != n_) throw Unsupported{};  // an unmatched ')'
        return root;
    }

  private:
    const uint8_t* s_;
    size_t n_, i_ = 0;
    int depth_ = 0;

    int add(Node node) {
        nodes.push_back(std::move(node));
        return static_cast<int>(nodes.size()) - 1;
    }
    bool at(char c) const { return i_ < n_ && s_[i_] == static_cast<uint8_t>(c); }

    int alternation() {
        if (++depth_ > 500) throw Unsupported{};
        Node alt(ALT);
        alt.kids.push_back(concatenation());
        while (at('|')) {
            ++i_;
            alt.kids.push_back(concatenation());
        }
        --depth_;
        return alt.kids.size() == 1 ? alt.kids[0] : add(std::move(alt));
    }

    int concatenation() {
        Node cat(CAT);
        while (i_ < n_ && !at('|') && !at(')')) cat.kids.push_back(repetition(atom()));
        if (cat.kids.empty()) return add(Node(EMPTY));
        return cat.kids.size() == 1 ? cat.kids[0] : add(std::move(cat));
    }

    int repetition(int item) {
        while (i_ < n_) {
            int lo, hi;
            char c = static_cast<char>(s_[i_]);
            if (c == '*') {
                lo = 0, hi = -1, ++i_;
            } else if (c == '+') {
                lo = 1, hi = -1, ++i_;
            } else if (c == '?') {
                lo = 0, hi = 1, ++i_;
            } else if (c == '{') {
                ++i_;
                lo = number();
                hi = lo;
                if (at(',')) {
                    ++i_;
                    hi = at('}') ? -1 : number();
                }
                if (!at('}') || (hi >= 0 && hi < lo)) throw Unsupported{};
                ++i_;
            } else {
                break;
            }
            if (at('?')) ++i_;  // lazy: the same language
            Node rep(REP);
            rep.kids.push_back(item);
            rep.lo = lo, rep.hi = hi;
            item = add(std::move(rep));
        }
        return item;
    }

    int number() {
        size_t start = i_;
        long value = 0;
        while (i_ < n_ && s_[i_] >= '0' && s_[i_] <= '9') {
            value = value * 10 + (s_[i_++] - '0');
            if (value > MAX_COUNT) throw Unsupported{};
        }
        if (i_ == start) throw Unsupported{};
        return static_cast<int>(value);
    }

    int set_node(std::vector<Range> r) {
        Node node(SET);
        node.set = normalize(std::move(r));
        return add(std::move(node));
    }

    int atom() {
        uint8_t c = s_[i_];
        if (c == '(') {
            ++i_;
            if (at('?')) {
                if (i_ + 1 < n_ && s_[i_ + 1] == ':') {
                    i_ += 2;
                } else {
                    throw Unsupported{};  // flags, named groups
                }
            }
            int inner = alternation();
            if (!at(')')) throw Unsupported{};
            ++i_;
            return inner;
        }
        if (c == '[') return set_node(char_class());
        if (c == '.') {
            ++i_;
            return set_node({{0, 9}, {11, MAX_CP}});  // any character but \n
        }
        if (c == '\\') {
            uint32_t cp = escape();
            return set_node({{cp, cp}});
        }
        if (c == '*' || c == '+' || c == '?' || c == '{' || c == '^' || c == '$' || c == ']' || c == '}') throw Unsupported{};
        uint32_t cp = utf8();
        return set_node({{cp, cp}});
    }

    // A code point written as UTF-8 in the regex text.
    uint32_t utf8() {
        uint8_t c = s_[i_];
        int extra = c < 0x80 ? 0 : c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : c >= 0xC0 ? 1 : -1;
        if (extra < 0 || i_ + extra >= n_) throw Unsupported{};
        uint32_t cp = extra == 0 ? c : c & (0x3F >> extra);
        ++i_;
        for (int k = 0; k < extra; ++k) {
            if (i_ >= n_ || (s_[i_] & 0xC0) != 0x80) throw Unsupported{};
            cp = cp << 6 | (s_[i_++] & 0x3F);
        }
        return cp;
    }

    uint32_t hex(size_t digits) {
        uint32_t value = 0;
        for (size_t k = 0; k < digits; ++k) {
            if (i_ >= n_) throw Unsupported{};
            uint8_t d = s_[i_++];
            int v = d >= '0' && d <= '9' ? d - '0' : d >= 'a' && d <= 'f' ? d - 'a' + 10 : d >= 'A' && d <= 'F' ? d - 'A' + 10 : -1;
            if (v < 0) throw Unsupported{};
            value = value << 4 | static_cast<uint32_t>(v);
        }
        return value;
    }

    // One escaped code point (after the backslash); classes (\d, \p..) and assertions are unsupported.
    uint32_t escape() {
        ++i_;  // the backslash
        if (i_ >= n_) throw Unsupported{};
        uint8_t c = s_[i_++];
        uint32_t cp;
        switch (c) {
            case 'n': return '\n';
            case 't': return '\t';
            case 'r': return '\r';
            case 'f': return '\f';
            case 'v': return '\v';
            case 'x':
            case 'u':
            case 'U':
                if (at('{')) {
                    ++i_;
                    size_t start = i_;
                    while (i_ < n_ && !at('}')) ++i_;
                    if (!at('}') || i_ == start || i_ - start > 8) throw Unsupported{};
                    size_t end = i_;
                    i_ = start;
                    cp = hex(end - start);
                    ++i_;  // '}'
                } else {
                    cp = hex(c == 'x' ? 2 : c == 'u' ? 4 : 8);
                }
                if (cp > MAX_CP || (cp >= 0xD800 && cp <= 0xDFFF)) throw Unsupported{};
                return cp;
            default:
                break;
        }
        // escaped metacharacters (and '"', '/', which JSON-minded regexes escape): themselves
        static const char* meta = "\\.+*?()|[]{}^$#&-~\"/";
        if (c < 0x80 && std::strchr(meta, c) != nullptr && c != 0) return c;
        throw Unsupported{};
    }

    uint32_t class_char() {
        if (at('\\')) return escape();
        if (at('[')) throw Unsupported{};  // a nested class
        return utf8();
    }

    std::vector<Range> char_class() {
        ++i_;  // '['
        bool negated = at('^');
        if (negated) ++i_;
        std::vector<Range> r;
        bool first = true;
        while (true) {
            if (i_ >= n_) throw Unsupported{};
            if (at(']') && !first) break;
            if ((at('&') || at('-') || at('~')) && i_ + 1 < n_ && s_[i_ + 1] == s_[i_]) throw Unsupported{};  // set operations
            uint32_t lo = class_char();
            uint32_t hi = lo;
            if (at('-') && i_ + 1 < n_ && s_[i_ + 1] != ']') {
                ++i_;
                hi = class_char();
                if (hi < lo) throw Unsupported{};
            }
            r.push_back({lo, hi});
            first = false;
        }
        ++i_;  // ']'
        return negated ? complement(normalize(r)) : normalize(r);
    }

};


// ---------------------------------------------------------------------------------------------
// Thompson NFA over bytes

struct Edge {
    uint8_t lo, hi;
    int to;
};

struct Nfa {
    std::vector<std::vector<int>> eps;
    std::vector<std::vector<Edge>> edges;
    size_t limit;

    int state() {
        if (eps.size() >= limit) throw Unsupported{};
        eps.emplace_back();
        edges.emplace_back();
        return static_cast<int>(eps.size()) - 1;
    }
};

struct Frag {
    int start, end;
};

using ByteSeq = std::vector<std::pair<uint8_t, uint8_t>>;

void encode(uint32_t cp, int n, uint8_t* out) {
    static const uint8_t lead[] = {0, 0, 0xC0, 0xE0, 0xF0};
    for (int k = n - 1; k > 0; --k) {
        out[k] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
        cp >>= 6;
    }
    out[0] = static_cast<uint8_t>(lead[n] | cp);
}

// [lo, hi] of one encoded length n as products of byte ranges: split until, at every
// continuation byte, the range either shares the bytes before it or covers all 64 values.
void same_length(uint32_t lo, uint32_t hi, int n, std::vector<ByteSeq>& out) {
    for (int i = 1; i < n; ++i) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if ((lo & m) != 0) {
                same_length(lo, lo | m, n, out);
                same_length((lo | m) + 1, hi, n, out);
                return;
            }
            if ((hi & m) != m) {
                same_length(lo, (hi & ~m) - 1, n, out);
                same_length(hi & ~m, hi, n, out);
                return;
            }
        }
    }
    uint8_t a[4], b[4];
    encode(lo, n, a);
    encode(hi, n, b);
    ByteSeq seq;
    for (int k = 0; k < n; ++k) seq.push_back({a[k], b[k]});
    out.push_back(seq);
}

void utf8_sequences(Range r, std::vector<ByteSeq>& out) {
    static const uint32_t last[] = {0x7F, 0x7FF, 0xFFFF, MAX_CP};
    uint32_t lo = r.lo;
    for (int n = 1; n <= 4 && lo <= r.hi; ++n) {
        if (lo > last[n - 1]) continue;
        uint32_t hi = std::min(r.hi, last[n - 1]);
        same_length(lo, hi, n, out);
        lo = hi + 1;
    }
}

class Compiler {
  public:
    Compiler(const std::vector<Node>& nodes, Nfa& nfa) : nodes_(nodes), nfa_(nfa) {}

    Frag compile(int id) {
        const Node& node = nodes_[id];
        switch (node.kind) {
            case EMPTY: {
                int s = nfa_.state();
                return {s, s};
            }
            case SET: return set(node.set);
            case CAT: {
                Frag whole = compile(node.kids[0]);
                for (size_t k = 1; k < node.kids.size(); ++k) {
                    Frag next = compile(node.kids[k]);
                    nfa_.eps[whole.end].push_back(next.start);
                    whole.end = next.end;
                }
                return whole;
            }
            case ALT: {
                int s = nfa_.state(), e = nfa_.state();
                for (int kid : node.kids) {
                    Frag f = compile(kid);
                    nfa_.eps[s].push_back(f.start);
                    nfa_.eps[f.end].push_back(e);
                }
                return {s, e};
            }
            case REP: return repeat(node.kids[0], node.lo, node.hi);
        }
        throw Unsupported{};
    }

  private:
    const std::vector<Node>& nodes_;
    Nfa& nfa_;

    // The class's UTF-8 sequences as chains into one end state, identical tails shared (after
    // E1 or EE, say, the same two continuation bytes remain: one NFA state, so one DFA state).
    Frag set(const std::vector<Range>& ranges) {
        int s = nfa_.state(), e = nfa_.state();
        std::vector<ByteSeq> seqs;
        for (Range r : ranges) utf8_sequences(r, seqs);
        std::vector<std::pair<uint32_t, int>> tails;  // (lo, hi, next) packed -> the state reading it
        for (const ByteSeq& seq : seqs) {
            int next = e;
            for (size_t k = seq.size() - 1; k > 0; --k) {
                uint32_t key = static_cast<uint32_t>(seq[k].first) << 24 | static_cast<uint32_t>(seq[k].second) << 16;
                int found = -1;
                for (const auto& [packed, state] : tails) {
                    if (packed == key && nfa_.edges[state][0].to == next) found = state;
                }
                if (found < 0) {
                    found = nfa_.state();
                    nfa_.edges[found].push_back({seq[k].first, seq[k].second, next});
                    tails.push_back({key, found});
                }
                next = found;
            }
            nfa_.edges[s].push_back({seq[0].first, seq[0].second, next});
        }
        return {s, e};
    }

    Frag repeat(int kid, int lo, int hi) {
        int s = nfa_.state();
        int end = s;
        for (int k = 0; k < lo; ++k) {
            Frag f = compile(kid);
            nfa_.eps[end].push_back(f.start);
            end = f.end;
        }
        if (hi < 0) {
            int loop = nfa_.state();
            Frag f = compile(kid);
            nfa_.eps[end].push_back(loop);
            nfa_.eps[loop].push_back(f.start);
            nfa_.eps[f.end].push_back(loop);
            return {s, loop};
        }
        if (hi > lo) {
            int e = nfa_.state();
            for (int k = lo; k < hi; ++k) {
                Frag f = compile(kid);
                nfa_.eps[end].push_back(e);
                nfa_.eps[end].push_back(f.start);
                end = f.end;
            }
            nfa_.eps[end].push_back(e);
            end = e;
        }
        return {s, end};
    }
};

// ---------------------------------------------------------------------------------------------
// Subset construction

struct Dfa {
    int num_classes = 0;
    uint8_t byte_class[256];
    std::vector<int32_t> next;     // [states, num_classes], -1: no edge
    std::vector<uint8_t> accepts;  // per state
};

class Determinizer {
  public:
    Determinizer(const Nfa& nfa, int final_state, size_t max_states)
        : nfa_(nfa), final_(final_state), max_states_(max_states), stamp_(nfa.eps.size(), 0),
          walk_stamp_(nfa.eps.size(), 0), own_(nfa.eps.size()), done_(nfa.eps.size(), 0) {
        classes();
    }

    Dfa run(int start) {
        std::vector<int> seed{start};
        add(closure(seed));
        std::vector<std::vector<int>> bucket(dfa_.num_classes);
        for (size_t d = 0; d < sets_.size(); ++d) {
            for (auto& b : bucket) b.clear();
            for (int s : sets_[d]) {
                for (const Edge& e : nfa_.edges[s]) {
                    for (int c = dfa_.byte_class[e.lo]; c <= dfa_.byte_class[e.hi]; ++c) bucket[c].push_back(e.to);
                }
            }
            for (int c = 0; c < dfa_.num_classes; ++c) {
                if (!bucket[c].empty()) dfa_.next[d * dfa_.num_classes + c] = add(closure(bucket[c]));
            }
        }
        return std::move(dfa_);
    }

  private:
    const Nfa& nfa_;
    int final_;
    size_t max_states_;
    std::vector<uint32_t> stamp_, walk_stamp_;
    uint32_t epoch_ = 0, walk_epoch_ = 0;
    std::vector<std::vector<int>> own_;  // per NFA state: its closure, once found
    std::vector<uint8_t> done_;
    Dfa dfa_;
    std::vector<std::vector<int>> sets_;
    std::unordered_map<std::string, int32_t> ids_;

    void classes() {
        bool cut[257] = {};
        for (const auto& edges : nfa_.edges) {
            for (const Edge& e : edges) cut[e.lo] = cut[e.hi + 1] = true;
        }
        int c = -1;
        for (int b = 0; b < 256; ++b) {
            if (b == 0 || cut[b]) ++c;
            dfa_.byte_class[b] = static_cast<uint8_t>(c);
        }
        dfa_.num_classes = c + 1;
    }

    // The NFA states reachable by empty moves, keeping only those that read a byte or end the
    // regex (the rest add nothing, so sets that differ only there are one state); each seed's
    // own closure is found once.
    std::vector<int> closure(const std::vector<int>& seeds) {
        ++epoch_;
        std::vector<int> kept;
        for (int seed : seeds) {
            for (int s : own_closure(seed)) {
                if (stamp_[s] != epoch_) stamp_[s] = epoch_, kept.push_back(s);
            }
        }
        std::sort(kept.begin(), kept.end());
        return kept;
    }

    const std::vector<int>& own_closure(int seed) {
        std::vector<int>& kept = own_[seed];
        if (done_[seed]) return kept;
        done_[seed] = 1;
        ++walk_epoch_;  // its own marks: closure() is midway through its own
        std::vector<int> todo{seed};
        while (!todo.empty()) {
            int s = todo.back();
            todo.pop_back();
            if (walk_stamp_[s] == walk_epoch_) continue;
            walk_stamp_[s] = walk_epoch_;
            if (!nfa_.edges[s].empty() || s == final_) kept.push_back(s);
            for (int t : nfa_.eps[s]) {
                if (walk_stamp_[t] != walk_epoch_) todo.push_back(t);
            }
        }
        return kept;
    }

    int32_t add(std::vector<int> set) {
        std::string key(reinterpret_cast<const char*>(set.data()), set.size() * sizeof(int));
        auto found = ids_.find(key);
        if (found != ids_.end()) return found->second;
        if (sets_.size() >= max_states_) throw Status(TOO_BIG);
        int32_t id = static_cast<int32_t>(sets_.size());
        ids_.emplace(std::move(key), id);
        dfa_.accepts.push_back(std::binary_search(set.begin(), set.end(), final_) ? 1 : 0);
        dfa_.next.resize(dfa_.next.size() + dfa_.num_classes, -1);
        sets_.push_back(std::move(set));
        return id;
    }
};

// ---------------------------------------------------------------------------------------------
// Dead ends cut, states renumbered from the start, dense rows

struct Result {
    int num_classes = 0;
    uint8_t byte_class[256];
    std::vector<int32_t> rows;  // [states, classes]: the next state (num_states: dead)
    std::vector<uint8_t> accepting;
    int64_t num_states = 0;

    int32_t next(int32_t state, int byte) const { return rows[static_cast<size_t>(state) * num_classes + byte_class[byte]]; }
    std::vector<int32_t> plane16;  // [edges, 3]: (state, code point - U+100000, state after it)
};

// The plane-16 characters U+100000-U+10FFFD readable from each state (the grammar rules' call
// markers, byte_dfa.call_marker), through their four UTF-8 bytes F4 8x xx xx.
void plane16_edges(Result& out) {
    int32_t dead = static_cast<int32_t>(out.num_states);
    for (int32_t q = 0; q < dead; ++q) {
        int32_t lead = out.next(q, 0xF4);
        if (lead == dead) continue;
        for (int b1 = 0x80; b1 < 0x90; ++b1) {  // F4 8x: U+100000-U+10FFFF
            int32_t s1 = out.next(lead, b1);
            if (s1 == dead) continue;
            for (int b2 = 0x80; b2 < 0xC0; ++b2) {
                int32_t s2 = out.next(s1, b2);
                if (s2 == dead) continue;
                for (int b3 = 0x80; b3 < 0xC0; ++b3) {
                    int32_t s3 = out.next(s2, b3);
                    int32_t code = (b1 & 0x0F) << 12 | (b2 & 0x3F) << 6 | (b3 & 0x3F);
                    if (s3 != dead && code < 0xFFFE) out.plane16.insert(out.plane16.end(), {q, code, s3});
                }
            }
        }
    }
}

// States from which an accepting state can be reached.
std::vector<uint8_t> live_states(const Dfa& dfa) {
    size_t n = dfa.accepts.size();
    int k = dfa.num_classes;
    std::vector<std::vector<int32_t>> back(n);
    for (size_t d = 0; d < n; ++d) {
        for (int c = 0; c < k; ++c) {
            int32_t t = dfa.next[d * k + c];
            if (t >= 0) back[t].push_back(static_cast<int32_t>(d));
        }
    }
    std::vector<uint8_t> live(dfa.accepts);
    std::vector<int32_t> todo;
    for (size_t d = 0; d < n; ++d) {
        if (live[d]) todo.push_back(static_cast<int32_t>(d));
    }
    while (!todo.empty()) {
        int32_t d = todo.back();
        todo.pop_back();
        for (int32_t p : back[d]) {
            if (!live[p]) live[p] = 1, todo.push_back(p);
        }
    }
    return live;
}

// The live states reachable from the start, renumbered breadth first (the start is 0), with
// their edges over byte classes; `dead` (= their number) stands for every cut or missing edge.
struct Trimmed {
    int32_t dead = 0;
    std::vector<int32_t> next;  // [dead + 1, classes]: the dead state's row maps to itself
    std::vector<uint8_t> accepts;
};

Trimmed trim(const Dfa& dfa) {
    std::vector<uint8_t> live = live_states(dfa);
    Trimmed out;
    if (!live[0]) return out;  // the regex matches nothing
    int k = dfa.num_classes;
    std::vector<int32_t> id(dfa.accepts.size(), -1), order{0};
    id[0] = 0;
    for (size_t q = 0; q < order.size(); ++q) {
        for (int c = 0; c < k; ++c) {
            int32_t t = dfa.next[order[q] * k + c];
            if (t >= 0 && live[t] && id[t] < 0) id[t] = static_cast<int32_t>(order.size()), order.push_back(t);
        }
    }
    out.dead = static_cast<int32_t>(order.size());
    out.next.assign(static_cast<size_t>(out.dead + 1) * k, out.dead);
    out.accepts.assign(out.dead + 1, 0);
    for (int32_t q = 0; q < out.dead; ++q) {
        out.accepts[q] = dfa.accepts[order[q]];
        for (int c = 0; c < k; ++c) {
            int32_t t = dfa.next[order[q] * k + c];
            if (t >= 0 && live[t]) out.next[static_cast<size_t>(q) * k + c] = id[t];
        }
    }
    return out;
}

// Hopcroft's partition refinement: per state, its block in the coarsest partition that keeps
// accepting apart from not and agrees on every class's next block (the minimal DFA's states).
class Minimizer {
  public:
    Minimizer(const Trimmed& dfa, int k) : dfa_(dfa), k_(k), n_(dfa.dead + 1) {
        inverse();
        elems_.resize(n_);
        loc_.resize(n_);
        block_.resize(n_);
        // Blocks to start: accepting, live and not accepting, dead (alone: every state is live).
        // Every block but one must be a splitter: leaving out the dead one skips its long
        // lists of predecessors (each missing edge).
        int32_t size[3] = {0, 0, 0};
        for (int32_t s = 0; s < n_; ++s) ++size[group(s)];
        int32_t at[3] = {0, size[0], size[0] + size[1]};
        int32_t id[3];
        for (int g = 0; g < 3; ++g) {
            id[g] = static_cast<int32_t>(first_.size());
            if (size[g] == 0) continue;
            first_.push_back(at[g]), end_.push_back(at[g] + size[g]);
            queued_.push_back(g < 2);
            if (g < 2) work_.push_back(id[g]);
        }
        mid_ = first_;
        for (int32_t s = 0; s < n_; ++s) {
            int g = group(s);
            elems_[at[g]] = s, loc_[s] = at[g]++, block_[s] = id[g];
        }
    }

    std::vector<int32_t> run() {
        std::vector<int32_t> splitter, classes;
        std::vector<std::vector<int32_t>> sources(k_);  // per class: the states led into the splitter
        while (!work_.empty()) {
            int32_t b = work_.back();
            work_.pop_back();
            queued_[b] = 0;
            splitter.assign(elems_.begin() + first_[b], elems_.begin() + end_[b]);
            for (int32_t t : splitter) {
                for (int32_t i = in_off_[t]; i < in_off_[t + 1]; ++i) {
                    int32_t c = in_class_[i];
                    if (sources[c].empty()) classes.push_back(c);
                    sources[c].push_back(in_src_[i]);
                }
            }
            for (int32_t c : classes) {
                for (int32_t s : sources[c]) mark(s);
                sources[c].clear();
                split();
            }
            classes.clear();
        }
        return block_;
    }

  private:
    const Trimmed& dfa_;
    int k_;
    int32_t n_;
    std::vector<int32_t> in_off_, in_src_, in_class_;  // per state: the edges into it
    std::vector<int32_t> elems_, loc_, block_, first_, end_, mid_, touched_, work_;
    std::vector<uint8_t> queued_;

    int group(int32_t s) const { return s == dfa_.dead ? 2 : dfa_.accepts[s] ? 0 : 1; }

    // The edges into each state but the dead one (never a splitter), as (class, source).
    void inverse() {
        in_off_.assign(n_ + 1, 0);
        const int32_t* next = dfa_.next.data();
        for (size_t e = 0; e < static_cast<size_t>(n_) * k_; ++e) {
            if (next[e] != dfa_.dead) ++in_off_[next[e] + 1];
        }
        for (int32_t t = 0; t < n_; ++t) in_off_[t + 1] += in_off_[t];
        in_src_.resize(in_off_.back());
        in_class_.resize(in_off_.back());
        std::vector<int32_t> fill(in_off_.begin(), in_off_.end() - 1);
        for (int32_t s = 0; s < n_; ++s) {
            for (int c = 0; c < k_; ++c) {
                int32_t t = next[static_cast<size_t>(s) * k_ + c];
                if (t == dfa_.dead) continue;
                in_src_[fill[t]] = s, in_class_[fill[t]++] = c;
            }
        }
    }

    // Moves s into the marked front of its block.
    void mark(int32_t s) {
        int32_t b = block_[s], at = loc_[s];
        if (at < mid_[b]) return;
        if (mid_[b] == first_[b]) touched_.push_back(b);
        int32_t other = elems_[mid_[b]];
        std::swap(elems_[at], elems_[mid_[b]]);
        loc_[other] = at, loc_[s] = mid_[b]++;
    }

    void split() {
        for (int32_t b : touched_) {
            if (mid_[b] == end_[b]) {  // all of it marked: nothing splits
                mid_[b] = first_[b];
                continue;
            }
            int32_t fresh = static_cast<int32_t>(first_.size());
            first_.push_back(first_[b]), end_.push_back(mid_[b]), mid_.push_back(first_[b]);
            first_[b] = mid_[b];
            for (int32_t i = first_[fresh]; i < end_[fresh]; ++i) block_[elems_[i]] = fresh;
            bool smaller = end_[fresh] - first_[fresh] <= end_[b] - first_[b];
            queued_.push_back(0);
            if (queued_[b]) {
                enqueue(fresh);
            } else {
                enqueue(smaller ? fresh : b);
            }
        }
        touched_.clear();
    }

    void enqueue(int32_t b) {
        if (!queued_[b]) queued_[b] = 1, work_.push_back(b);
    }
};

Result dense(const Dfa& dfa) {
    Trimmed trimmed = trim(dfa);
    Result out;
    if (trimmed.dead == 0) return out;
    int k = dfa.num_classes;
    std::vector<int32_t> block = Minimizer(trimmed, k).run();
    // one state per block, breadth first from the start's; the dead state's block is left out
    std::vector<int32_t> id(block.size(), -1), order{0};
    int32_t dead_block = block[trimmed.dead];
    id[block[0]] = 0;
    for (size_t q = 0; q < order.size(); ++q) {
        for (int c = 0; c < k; ++c) {
            int32_t t = trimmed.next[static_cast<size_t>(order[q]) * k + c];
            if (block[t] != dead_block && id[block[t]] < 0) id[block[t]] = static_cast<int32_t>(order.size()), order.push_back(t);
        }
    }
    int32_t dead = static_cast<int32_t>(order.size());
    out.num_states = dead;
    out.num_classes = k;
    std::memcpy(out.byte_class, dfa.byte_class, 256);
    out.rows.resize(static_cast<size_t>(dead) * k);
    out.accepting.assign(dead + 1, 0);
    for (int32_t q = 0; q < dead; ++q) {
        out.accepting[q] = trimmed.accepts[order[q]];
        const int32_t* row = &trimmed.next[static_cast<size_t>(order[q]) * k];
        int32_t* mapped = &out.rows[static_cast<size_t>(q) * k];
        for (int c = 0; c < k; ++c) mapped[c] = block[row[c]] == dead_block ? dead : id[block[row[c]]];
    }
    return out;
}

}  // namespace

// Builds `regex`'s DFA. info[0]: the status (0 built, 1 syntax this builder leaves to
// outlines-core, 2 more than max_states states); info[1]: the number of states (0 when the
// regex matches nothing: left to outlines-core too); info[2]: the number of plane-16 edges. Returns the result for
// langrt_regex_dfa_take (null unless built), which copies it out and frees it.
extern "C" void* langrt_regex_dfa_build(const char* regex, int64_t size, int64_t max_states, int64_t* info) {
    info[0] = UNSUPPORTED;
    info[1] = info[2] = 0;
    try {
        Parser parser(reinterpret_cast<const uint8_t*>(regex), static_cast<size_t>(size));
        int root = parser.parse();
        Nfa nfa;
        nfa.limit = static_cast<size_t>(std::max<int64_t>(max_states, 1)) * 64;
        Compiler compiler(parser.nodes, nfa);
        Frag whole = compiler.compile(root);
        // The DFA is built with room for the dead ends it will cut.
        Determinizer determinizer(nfa, whole.end, static_cast<size_t>(max_states) * 2 + 16);
        Result* result = new Result(dense(determinizer.run(whole.start)));
        if (result->num_states == 0 || result->num_states > max_states) {
            info[0] = result->num_states == 0 ? UNSUPPORTED : TOO_BIG;
            info[1] = result->num_states;
            delete result;
            return nullptr;
        }
        plane16_edges(*result);
        info[0] = OK;
        info[1] = result->num_states;
        info[2] = static_cast<int64_t>(result->plane16.size() / 3);
        return result;
    } catch (Unsupported&) {
        return nullptr;
    } catch (Status status) {
        info[0] = status;
        return nullptr;
    } catch (std::bad_alloc&) {
        info[0] = TOO_BIG;
        return nullptr;
    }
}

// Writes the table ([states + 1, 256]), the accepting flags and the plane-16 edges ([edges, 3])
// of a built result, and frees it.
extern "C" void langrt_regex_dfa_take(void* built, int32_t* table, uint8_t* accepting, int32_t* plane16) {
    Result* result = static_cast<Result*>(built);
    int32_t dead = static_cast<int32_t>(result->num_states);
    for (int32_t q = 0; q < dead; ++q) {
        for (int b = 0; b < 256; ++b) table[static_cast<size_t>(q) * 256 + b] = result->next(q, b);
    }
    for (int b = 0; b < 256; ++b) table[static_cast<size_t>(dead) * 256 + b] = dead;
    std::memcpy(accepting, result->accepting.data(), result->accepting.size());
    std::memcpy(plane16, result->plane16.data(), result->plane16.size() * sizeof(int32_t));
    delete result;
}
