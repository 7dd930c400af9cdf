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
