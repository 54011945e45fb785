/* json.h: a small, strict JSON reader for geon plans.
 *
 * The whole document is read into a tree of nodes held in one array. Every read is
 * bounded by the given length (the text need not end in NUL), nesting is limited to
 * GN_JSON_MAX_DEPTH, and anything that is not RFC 8259 JSON (trailing commas, comments,
 * NaN, leading zeros, control characters in strings, invalid UTF-8, bytes after the
 * value) is refused with a message naming the byte offset. */
#ifndef GN_JSON_H
#define GN_JSON_H

#include <stddef.h>
#include <stdint.h>

#define GN_JSON_MAX_DEPTH 64

typedef enum { GJ_NULL, GJ_FALSE, GJ_TRUE, GJ_NUMBER, GJ_STRING, GJ_ARRAY, GJ_OBJECT } gj_type;

typedef struct {
  gj_type type;
  int is_int;        /* a number written without fraction or exponent that fits int64 */
  int64_t ival;      /* its value when is_int */
  int is_uint;       /* such a number without a minus sign that fits uint64 */
  uint64_t uval;     /* its value when is_uint (2**63 and more: is_uint but not is_int) */
  double num;        /* a number's value */
  const char *str;   /* a string's decoded bytes (NUL-terminated copy), or a key */
  size_t str_len;
  const char *key;   /* the member's key when the parent is an object */
  size_t key_len;
  int32_t first;     /* first child (-1: none) */
  int32_t next;      /* next sibling (-1: none) */
  int32_t count;     /* number of children */
} gj_node;

typedef struct {
  gj_node *nodes;
  int32_t n_nodes, cap_nodes;
  char *strings;     /* decoded strings and keys, one after the other */
  size_t str_used, str_cap;
} gj_doc;

/* Parse len bytes of text into doc (root: doc->nodes[0]). 0 on success; otherwise -1
 * with a message in msg (msg_len bytes), or -2 when memory ran out. */
int gj_parse(const char *text, size_t len, gj_doc *doc, char *msg, size_t msg_len);
void gj_free(gj_doc *doc);

/* The member called key of object node (the last one if repeated), or NULL. */
const gj_node *gj_get(const gj_doc *doc, const gj_node *obj, const char *key);
/* The i-th child of an array or object (NULL when out of range). Children are walked
 * with gj_first / gj_next for linear time. */
const gj_node *gj_at(const gj_doc *doc, const gj_node *node, int32_t i);
const gj_node *gj_first(const gj_doc *doc, const gj_node *node);
const gj_node *gj_next(const gj_doc *doc, const gj_node *node);
/* Whether node is a string equal to s. */
int gj_is(const gj_node *node, const char *s);

#endif
