/* json.c: the strict JSON reader of json.h (recursive descent, depth-limited). */
#include "json.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  const unsigned char *s;
  size_t len, pos;
  gj_doc *doc;
  char *msg;
  size_t msg_len;
  int oom;
} reader;

static int fail(reader *r, const char *what) {
  if (r->msg_len) snprintf(r->msg, r->msg_len, "not valid JSON: %s at byte %zu", what, r->pos);
  return -1;
}

static void skip_space(reader *r) {
  while (r->pos < r->len) {
    unsigned char c = r->s[r->pos];
    if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
    r->pos++;
  }
}

/* A new node (index) with its links cleared, or -1 when memory ran out. */
static int32_t new_node(reader *r, gj_type type) {
  gj_doc *d = r->doc;
  if (d->n_nodes == d->cap_nodes) {
    if (d->cap_nodes > INT32_MAX / 2) { r->oom = 1; return -1; }
    int32_t cap = d->cap_nodes ? d->cap_nodes * 2 : 64;
    gj_node *grown = realloc(d->nodes, (size_t)cap * sizeof(gj_node));
    if (!grown) { r->oom = 1; return -1; }
    d->nodes = grown;
    d->cap_nodes = cap;
  }
  gj_node *n = &d->nodes[d->n_nodes];
  memset(n, 0, sizeof *n);
  n->type = type;
  n->first = n->next = -1;
  return d->n_nodes++;
}

/* Append one code point to the string arena as UTF-8. */
static void put_utf8(gj_doc *d, uint32_t cp) {
  char *o = d->strings + d->str_used;
  if (cp < 0x80) { o[0] = (char)cp; d->str_used += 1; }
  else if (cp < 0x800) {
    o[0] = (char)(0xC0 | (cp >> 6)); o[1] = (char)(0x80 | (cp & 0x3F)); d->str_used += 2;
  } else if (cp < 0x10000) {
    o[0] = (char)(0xE0 | (cp >> 12)); o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[2] = (char)(0x80 | (cp & 0x3F)); d->str_used += 3;
  } else {
    o[0] = (char)(0xF0 | (cp >> 18)); o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); o[3] = (char)(0x80 | (cp & 0x3F));
    d->str_used += 4;
  }
}

static int hex4(reader *r, uint32_t *out) {
  if (r->len - r->pos < 4) return fail(r, "a short \\u escape");
  uint32_t v = 0;
  for (int i = 0; i < 4; i++) {
    unsigned char c = r->s[r->pos++];
    v <<= 4;
    if (c >= '0' && c <= '9') v |= (uint32_t)(c - '0');
    else if (c >= 'a' && c <= 'f') v |= (uint32_t)(c - 'a' + 10);
    else if (c >= 'A' && c <= 'F') v |= (uint32_t)(c - 'A' + 10);
    else return fail(r, "a bad \\u escape");
  }
  *out = v;
  return 0;
}

/* The length of the valid UTF-8 sequence starting at s[pos] (0: invalid). */
static size_t utf8_len(const unsigned char *s, size_t avail) {
  unsigned char c = s[0];
  size_t n;
  uint32_t cp;
  if (c < 0x80) return 1;
  if ((c & 0xE0) == 0xC0) { n = 2; cp = c & 0x1F; }
  else if ((c & 0xF0) == 0xE0) { n = 3; cp = c & 0x0F; }
  else if ((c & 0xF8) == 0xF0) { n = 4; cp = c & 0x07; }
  else return 0;
  if (avail < n) return 0;
  for (size_t i = 1; i < n; i++) {
    if ((s[i] & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (s[i] & 0x3F);
  }
  /* no overlong forms, no surrogates, nothing past U+10FFFF */
  if ((n == 2 && cp < 0x80) || (n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000) ||
      (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF)
    return 0;
  return n;
}

/* A string starting at the opening quote: decoded into the arena. */
static int read_string(reader *r, const char **out, size_t *out_len) {
  gj_doc *d = r->doc;
  r->pos++; /* the quote */
  size_t start = d->str_used;
  for (;;) {
    if (r->pos >= r->len) return fail(r, "an unterminated string");
    unsigned char c = r->s[r->pos];
    if (c == '"') { r->pos++; break; }
    if (c < 0x20) return fail(r, "a control character in a string");
    if (c == '\\') {
      if (r->pos + 1 >= r->len) return fail(r, "an unterminated string");
      unsigned char e = r->s[r->pos + 1];
      r->pos += 2;
      const char *simple = strchr("\"\\/bfnrt", e);
      if (e && simple) {
        static const char map[] = "\"\\/\b\f\n\r\t";
        d->strings[d->str_used++] = map[simple - "\"\\/bfnrt"];
      } else if (e == 'u') {
        uint32_t cp, lo;
        if (hex4(r, &cp)) return -1;
        if (cp >= 0xD800 && cp <= 0xDBFF) { /* a surrogate pair */
          if (r->len - r->pos < 2 || r->s[r->pos] != '\\' || r->s[r->pos + 1] != 'u')
            return fail(r, "a lone surrogate");
          r->pos += 2;
          if (hex4(r, &lo)) return -1;
          if (lo < 0xDC00 || lo > 0xDFFF) return fail(r, "a bad surrogate pair");
          cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
          return fail(r, "a lone surrogate");
        }
        if (cp == 0) return fail(r, "a NUL character in a string");
        put_utf8(d, cp); /* never longer than its escape (6 or 12 bytes) */
      } else {
        return fail(r, "a bad escape");
      }
      continue;
    }
    size_t n = utf8_len(r->s + r->pos, r->len - r->pos);
    if (!n) return fail(r, "invalid UTF-8");
    memcpy(d->strings + d->str_used, r->s + r->pos, n);
    d->str_used += n;
    r->pos += n;
  }
  d->strings[d->str_used++] = '\0';
  *out = d->strings + start;
  *out_len = d->str_used - start - 1;
  return 0;
}

static int read_number(reader *r, gj_node *n) {
  size_t start = r->pos;
  const unsigned char *s = r->s;
  int integral = 1;
  if (r->pos < r->len && s[r->pos] == '-') r->pos++;
  if (r->pos >= r->len) return fail(r, "a bad number");
  if (s[r->pos] == '0') {
    r->pos++;
  } else if (s[r->pos] >= '1' && s[r->pos] <= '9') {
    while (r->pos < r->len && s[r->pos] >= '0' && s[r->pos] <= '9') r->pos++;
  } else {
    return fail(r, "a bad number");
  }
  if (r->pos < r->len && s[r->pos] == '.') {
    integral = 0;
    r->pos++;
    if (r->pos >= r->len || s[r->pos] < '0' || s[r->pos] > '9') return fail(r, "a bad number");
    while (r->pos < r->len && s[r->pos] >= '0' && s[r->pos] <= '9') r->pos++;
  }
  if (r->pos < r->len && (s[r->pos] == 'e' || s[r->pos] == 'E')) {
    integral = 0;
    r->pos++;
    if (r->pos < r->len && (s[r->pos] == '+' || s[r->pos] == '-')) r->pos++;
    if (r->pos >= r->len || s[r->pos] < '0' || s[r->pos] > '9') return fail(r, "a bad number");
    while (r->pos < r->len && s[r->pos] >= '0' && s[r->pos] <= '9') r->pos++;
  }
  size_t n_chars = r->pos - start;
  char buf[128];
  if (n_chars >= sizeof buf) return fail(r, "a number too long");
  memcpy(buf, s + start, n_chars);
  buf[n_chars] = '\0';
  n->num = strtod(buf, NULL);
  if (integral) {
    errno = 0;
    long long v = strtoll(buf, NULL, 10);
    if (errno == 0) { n->is_int = 1; n->ival = (int64_t)v; }
    if (buf[0] != '-') {
      errno = 0;
      unsigned long long u = strtoull(buf, NULL, 10);
      if (errno == 0) { n->is_uint = 1; n->uval = (uint64_t)u; }
    }
  }
  return 0;
}

static int read_value(reader *r, int32_t *out, int depth);

/* An array or object starting at its bracket; children are linked in order. */
static int read_container(reader *r, int32_t self, int depth, int object) {
  char close = object ? '}' : ']';
  int32_t last = -1;
  r->pos++;
  skip_space(r);
  if (r->pos < r->len && r->s[r->pos] == (unsigned char)close) { r->pos++; return 0; }
  for (;;) {
    const char *key = NULL;
    size_t key_len = 0;
    if (object) {
      skip_space(r);
      if (r->pos >= r->len || r->s[r->pos] != '"') return fail(r, "expected a key");
      if (read_string(r, &key, &key_len)) return -1;
      skip_space(r);
      if (r->pos >= r->len || r->s[r->pos] != ':') return fail(r, "expected ':'");
      r->pos++;
    }
    int32_t child;
    if (read_value(r, &child, depth + 1)) return -1;
    gj_node *nodes = r->doc->nodes; /* (the array may have moved) */
    nodes[child].key = key;
    nodes[child].key_len = key_len;
    if (last < 0) nodes[self].first = child; else nodes[last].next = child;
    last = child;
    nodes[self].count++;
    skip_space(r);
    if (r->pos >= r->len) return fail(r, "an unterminated container");
    unsigned char c = r->s[r->pos++];
    if (c == (unsigned char)close) return 0;
    if (c != ',') return fail(r, object ? "expected ',' or '}'" : "expected ',' or ']'");
  }
}

static int literal(reader *r, const char *word) {
  size_t n = strlen(word);
  if (r->len - r->pos < n || memcmp(r->s + r->pos, word, n) != 0) return fail(r, "an unexpected character");
  r->pos += n;
  return 0;
}

static int read_value(reader *r, int32_t *out, int depth) {
  if (depth > GN_JSON_MAX_DEPTH) return fail(r, "nesting deeper than 64");
  skip_space(r);
  if (r->pos >= r->len) return fail(r, "an unexpected end");
  unsigned char c = r->s[r->pos];
  gj_type t = c == '{' ? GJ_OBJECT : c == '[' ? GJ_ARRAY : c == '"' ? GJ_STRING :
              c == 't' ? GJ_TRUE : c == 'f' ? GJ_FALSE : c == 'n' ? GJ_NULL : GJ_NUMBER;
  int32_t self = new_node(r, t);
  if (self < 0) return -1;
  *out = self;
  switch (t) {
    case GJ_OBJECT: return read_container(r, self, depth, 1);
    case GJ_ARRAY: return read_container(r, self, depth, 0);
    case GJ_STRING: {
      const char *s;
      size_t n;
      if (read_string(r, &s, &n)) return -1;
      r->doc->nodes[self].str = s;
      r->doc->nodes[self].str_len = n;
      return 0;
    }
    case GJ_TRUE: return literal(r, "true");
    case GJ_FALSE: return literal(r, "false");
    case GJ_NULL: return literal(r, "null");
    default: return read_number(r, &r->doc->nodes[self]);
  }
}

int gj_parse(const char *text, size_t len, gj_doc *doc, char *msg, size_t msg_len) {
  memset(doc, 0, sizeof *doc);
  reader r = {(const unsigned char *)text, len, 0, doc, msg, msg_len, 0};
  /* decoded strings are never longer than their quoted text: len + 1 bytes suffice */
  doc->str_cap = len + 1;
  doc->strings = malloc(doc->str_cap);
  if (!doc->strings) return -2;
  if (!text) return fail(&r, "no text");
  int32_t root;
  int rc = read_value(&r, &root, 1);
  if (rc == 0) {
    skip_space(&r);
    if (r.pos != len) rc = fail(&r, "text after the value");
  }
  if (r.oom) return -2;
  return rc;
}

void gj_free(gj_doc *doc) {
  free(doc->nodes);
  free(doc->strings);
  memset(doc, 0, sizeof *doc);
}

const gj_node *gj_first(const gj_doc *doc, const gj_node *node) {
  if (!node || (node->type != GJ_ARRAY && node->type != GJ_OBJECT) || node->first < 0) return NULL;
  return &doc->nodes[node->first];
}

const gj_node *gj_next(const gj_doc *doc, const gj_node *node) {
  return node && node->next >= 0 ? &doc->nodes[node->next] : NULL;
}

const gj_node *gj_get(const gj_doc *doc, const gj_node *obj, const char *key) {
  if (!obj || obj->type != GJ_OBJECT) return NULL;
  size_t n = strlen(key);
  const gj_node *found = NULL;
  for (const gj_node *c = gj_first(doc, obj); c; c = gj_next(doc, c)) {
    if (c->key_len == n && memcmp(c->key, key, n) == 0) found = c;
  }
  return found;
}

const gj_node *gj_at(const gj_doc *doc, const gj_node *node, int32_t i) {
  const gj_node *c = gj_first(doc, node);
  for (; c && i > 0; i--) c = gj_next(doc, c);
  return i == 0 ? c : NULL;
}

int gj_is(const gj_node *node, const char *s) {
  return node && node->type == GJ_STRING && node->str_len == strlen(s) &&
         memcmp(node->str, s, node->str_len) == 0;
}
