# Audio input (src/media/audio.c, mel.c): libsndfile decodes, libsoxr resamples, FFTW3 (double
# precision) runs the log-mel FFT. Each is optional at configure time: a missing one is
# reported here and the matching call returns ANNA_EUNSUPPORTED naming the package.
pkg_check_modules(SNDFILE IMPORTED_TARGET sndfile)
pkg_check_modules(SOXR IMPORTED_TARGET soxr)
pkg_check_modules(FFTW3 IMPORTED_TARGET fftw3)
foreach(_dep SNDFILE:libsndfile1-dev SOXR:libsoxr-dev FFTW3:libfftw3-dev)
  string(REPLACE ":" ";" _pair ${_dep})
  list(GET _pair 0 _var)
  list(GET _pair 1 _pkg)
  if(${_var}_FOUND)
    message(STATUS "audio: ${_var} ${${_var}_VERSION}")
  else()
    message(WARNING "audio: ${_pkg} not found; audio decoding/features will be refused at run time")
  endif()
endforeach()
# Audio output (anna_audio_encoder, src/runtime/api_speech.c): libsndfile writes wav, pcm,
# flac, Ogg Opus and, from 1.1.0 when built with LAME + mpg123 (Debian's is), mp3. What this
# libsndfile can write is checked at run time (sf_format_check): a missing format is refused
# with ANNA_EUNSUPPORTED naming it; aac has no encoder here.
if(SNDFILE_FOUND AND SNDFILE_VERSION VERSION_LESS 1.1.0)
  message(WARNING "speech output: libsndfile ${SNDFILE_VERSION} predates MPEG support: mp3 will be refused")
elseif(SNDFILE_FOUND)
  message(STATUS "speech output: wav pcm flac opus mp3 (libsndfile ${SNDFILE_VERSION}); aac: none")
else()
  message(WARNING "speech output: libsndfile1-dev not found; every output format will be refused")
endif()
# Speech speed (src/media/tempo.c): FFmpeg's atempo filter through libavfilter, optional; without
# it a speed other than 1 is refused at run time naming libavfilter-dev.
if(ANNA_FFMPEG)
  pkg_check_modules(AVFILTER IMPORTED_TARGET libavfilter libavutil)
else()
  set(AVFILTER_FOUND 0)
endif()
if(AVFILTER_FOUND)
  message(STATUS "speech speed: atempo (libavfilter ${AVFILTER_libavfilter_VERSION})")
elseif(NOT ANNA_FFMPEG)
  message(STATUS "speech speed: off (ANNA_FFMPEG=OFF; a speed other than 1 will be refused)")
else()
  message(WARNING "speech speed: libavfilter-dev not found; a speed other than 1 will be refused")
endif()
