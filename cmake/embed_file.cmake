# Turns one file into C source at build time (cmake -P): a byte array, its length and a
# strong ETag (SHA-256 prefix of the bytes), so anna-serve carries its web page inside the
# binary and needs no file at run time.
#   cmake -DIN=web/index.html -DOUT=build/.../index_html.c -DNAME=webui_index_html -P embed_file.cmake
# defines: const unsigned char NAME[]; const size_t NAME_len; const char NAME_etag[].
if(NOT IN OR NOT OUT OR NOT NAME)
  message(FATAL_ERROR "embed_file.cmake: IN, OUT and NAME are required")
endif()
file(READ "${IN}" hex HEX)
file(SHA256 "${IN}" sha)
string(SUBSTRING "${sha}" 0 32 etag)
string(LENGTH "${hex}" nhex)
math(EXPR n "${nhex} / 2")
# 0xNN, per byte; a NUL terminator follows so the array is also a C string.
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," body "${hex}")
string(REGEX REPLACE "((0x..,){16})" "\\1\n  " body "${body}")
file(WRITE "${OUT}.tmp"
  "/* generated from ${IN} by cmake/embed_file.cmake: do not edit */\n"
  "#include <stddef.h>\n"
  "const unsigned char ${NAME}[] = {\n  ${body}0x00};\n"
  "const size_t ${NAME}_len = ${n};\n"
  "const char ${NAME}_etag[] = \"\\\"${etag}\\\"\";\n")
file(COPY_FILE "${OUT}.tmp" "${OUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUT}.tmp")
