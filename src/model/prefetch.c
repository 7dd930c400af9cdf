/* prefetch.c: the weight files' read-ahead pass (see prefetch.h). */
#include "prefetch.h"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CHUNK ((size_t)8 << 20)
#define MAX_FILES 4096

typedef struct file_list {
  char **path;
  uint64_t *size;
  int n;
} file_list;

static int ends_with(const char *s, const char *suffix) {
  const size_t n = strlen(s), m = strlen(suffix);
  return n >= m && !strcmp(s + n - m, suffix);
}

static void list_add(file_list *l, const char *path, uint64_t size) {
  if (l->n >= MAX_FILES) return;
  char *p = strdup(path);
  if (!p) return;
  l->path[l->n] = p;
  l->size[l->n++] = size;
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* dir's *.safetensors (and its subfolders' when depth > 0), sorted by name per folder. */
static void list_folder(file_list *l, const char *dir, int depth) {
  DIR *d = opendir(dir);
  if (!d) return;
  char **names = NULL;
  size_t n = 0, cap = 0;
  struct dirent *de;
  while ((de = readdir(d))) {
    if (de->d_name[0] == '.') continue;
    if (n == cap) {
      char **nn = realloc(names, sizeof *nn * (cap = cap ? 2 * cap : 64));
      if (!nn) break;
      names = nn;
    }
    if (!(names[n] = strdup(de->d_name))) break;
    n++;
  }
  closedir(d);
  if (n) qsort(names, n, sizeof *names, cmp_str);
  for (size_t i = 0; i < n; i++) {
    char p[PATH_MAX];
    struct stat st;
    if (snprintf(p, sizeof p, "%s/%s", dir, names[i]) < (int)sizeof p && stat(p, &st) == 0) {
      if (S_ISREG(st.st_mode) && ends_with(names[i], ".safetensors"))
        list_add(l, p, (uint64_t)st.st_size);
      else if (S_ISDIR(st.st_mode) && depth > 0)
        list_folder(l, p, depth - 1);
    }
    free(names[i]);
  }
  free(names);
}

uint64_t model_prefetch(const char *path, int is_gguf, model_progress_fn progress, void *user) {
  file_list l = {.path = calloc(MAX_FILES, sizeof(char *)), .size = calloc(MAX_FILES, sizeof(uint64_t))};
  char *buf = malloc(CHUNK);
  uint64_t total = 0, done = 0;
  if (!l.path || !l.size || !buf) goto out;
  if (is_gguf) {
    struct stat st;
    if (stat(path, &st) == 0 && S_ISREG(st.st_mode)) list_add(&l, path, (uint64_t)st.st_size);
  } else {
    list_folder(&l, path, 1);
  }
  for (int i = 0; i < l.n; i++)
    total += l.size[i];
  if (progress) progress(user, 0, total);
  int ok = 1;
  for (int i = 0; i < l.n && ok; i++) {
    const int fd = open(l.path[i], O_RDONLY | O_CLOEXEC);
    if (fd < 0) break;
    posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    uint64_t left = l.size[i], since = 0;
    while (left > 0) {
      const ssize_t r = read(fd, buf, left < CHUNK ? (size_t)left : CHUNK);
      if (r <= 0) { /* a read error or a file that shrank: the load reports what is wrong */
        ok = 0;
        break;
      }
      left -= (uint64_t)r;
      done += (uint64_t)r;
      since += (uint64_t)r;
      if (progress && (since >= ((uint64_t)64 << 20) || left == 0) && done < total) {
        progress(user, done, total);
        since = 0;
      }
    }
    close(fd);
  }
out:
  if (progress) progress(user, total, total);
  for (int i = 0; i < l.n; i++)
    free(l.path[i]);
  free(l.path);
  free(l.size);
  free(buf);
  return done;
}
